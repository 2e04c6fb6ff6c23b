// core/observe/jobview.cc — the job view's listener, handshake, requests and
// tree fan-out (the protocol: core/observe/jobview.h).
#include "core/observe/jobview.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "base/env.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/crypto.h"
#include "bootstrap/socket.h"
#include "bootstrap/store.h"
#include "transport/transport.h"

namespace harp::obs {
namespace jobview {
namespace {

constexpr char kMagic[4] = {'H', 'J', 'V', '1'};
constexpr size_t kHello = 4 + 8 + crypto::kNonceBytes;
constexpr size_t kDumpCap = size_t{1} << 30;  // a flight record's pickle, at most

struct Listener {
  std::mutex mu;
  int fd = -1;
  std::string addr;  // "host:port" as published
  std::atomic<int> poll_fd{-1};
};

Listener& listener() {
  static Listener* l = new Listener;  // never freed: the observer thread polls it until exit
  return *l;
}

std::string ownAddr() {
  std::lock_guard<std::mutex> g(listener().mu);
  return listener().addr;
}

std::string hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : b) o += d[c >> 4], o += d[c & 15];
  return o;
}

std::string commHex(uint64_t id) {
  char b[24];
  snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(id));
  return b;
}

std::string keyOf(Recorder& r) { return crypto::deriveKey(r.identity().secret, "jobview"); }
std::string contextOf(uint64_t comm) { return "jobview|" + commHex(comm); }

void putU32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t getU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// The live recorder of (comm, rank); rank -1: any rank of comm.
std::shared_ptr<Recorder> find(uint64_t comm, int rank) {
  for (auto& r : liveRecorders())
    if (r->identity().comm_id == comm && !r->identity().secret.empty() && (rank < 0 || r->identity().rank == rank))
      return r;
  return nullptr;
}

std::string hostIdOf() {
  if (env::has("HARP_HOSTID")) return env::str("HARP_HOSTID").substr(0, 255);  // the entry stays under kEntryCap
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  return host;
}

// This rank's links, by peer class (same host, other hosts) and transport:
// [{"peers": class, "transport": name, "n": peers, and where the transport
// reports its links (transport::LinkStatus): "up", "not_connected" (lazy
// set-up: no connection yet), "failed", "lanes": {"<lanes>": peers up with that
// many}}]. At most 2 classes x a few transports, lane counts bounded by the
// transport: well under kEntryCap.
std::string linksJson(const Recorder& r) {
  struct Group {
    std::string cls, transport;
    int n = 0, up = 0, not_yet = 0, failed = 0;
    bool reported = false;
    std::map<int, int> lanes;  // lanes -> peers up with that many
  };
  std::vector<Group> groups;
  r.withLinks([&](const std::vector<transport::Transport*>& of, const std::vector<char>& local) {
    for (size_t p = 0; p < of.size(); ++p) {
      if (!of[p]) continue;
      const std::string cls = p < local.size() && local[p] ? "same host" : "other hosts", name = of[p]->name();
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const Group& x) { return x.cls == cls && x.transport == name; });
      if (g == groups.end()) g = groups.insert(groups.end(), Group{cls, name});
      ++g->n;
      auto* ls = transport::capabilityOf<transport::LinkStatus>(of[p]);
      if (!ls) continue;
      g->reported = true;
      const auto l = ls->link(static_cast<int>(p));
      if (l.state == transport::LinkStatus::kUp) ++g->up, ++g->lanes[std::clamp(l.lanes, 0, 9999)];
      else if (l.state == transport::LinkStatus::kNotYet) ++g->not_yet;
      else ++g->failed;
    }
  });
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    return (a.cls != "same host") < (b.cls != "same host");  // the same host first
  });
  std::string o = "[";
  for (size_t i = 0; i < groups.size() && i < 4; ++i) {
    const Group& g = groups[i];
    o += (i ? ",{" : "{") + std::string("\"peers\":") + jsonString(g.cls) + ",\"transport\":" +
         jsonString(g.transport) + ",\"n\":" + std::to_string(g.n);
    if (g.reported) {
      o += ",\"up\":" + std::to_string(g.up) + ",\"not_connected\":" + std::to_string(g.not_yet) +
           ",\"failed\":" + std::to_string(g.failed) + ",\"lanes\":{";
      int k = 0;
      for (auto it = g.lanes.begin(); it != g.lanes.end() && k < 8; ++it, ++k)
        o += (k ? ",\"" : "\"") + std::to_string(it->first) + "\":" + std::to_string(it->second);
      o += "}";
    }
    o += "}";
  }
  return o + "]";
}

// This rank's entry, under kEntryCap bytes (the stall view is cut to fit).
std::string entryJson(Recorder& r) {
  const Identity& id = r.identity();
  OpSnapshot op;
  const uint64_t now = ticks();
  std::string flight = r.inFlight(&op) ? opJson(r, op, now) : "null";
  std::string last = "null";
  auto ring = r.snapshot();
  if (!ring.empty()) {
    const OpSnapshot& l = ring.back();
    last = "{\"collective\":" + jsonString(collName(static_cast<CollType>(l.coll))) + ",\"seq\":" +
           std::to_string(l.seq) + ",\"state\":" + jsonString(stateName(l.state)) + "}";
  }
  auto headWith = [&](const std::string& links) {
    return "{\"rank\":" + std::to_string(id.rank) + ",\"state\":\"ok\",\"host\":" +
           jsonString(id.rank < static_cast<int>(id.hosts.size()) ? id.hosts[id.rank] : "?") + ",\"hostid\":" +
           jsonString(hostIdOf()) + ",\"pid\":" + std::to_string(getpid()) + ",\"transport\":" +
           jsonString(id.transport) + ",\"links\":" + links + ",\"started\":" + std::to_string(r.started()) +
           ",\"completed\":" + std::to_string(r.completed()) + ",\"ops\":" + std::to_string(r.ops()) +
           ",\"in_flight\":" + flight + ",\"last\":" + last + ",\"stall_view\":";
  };
  std::string head = headWith(linksJson(r));
  if (head.size() > kEntryCap - 128) head = headWith("[]");  // a long HARP_HOSTID: the links give way
  std::string view = r.stallView();
  const size_t room = kEntryCap - 64 > head.size() ? (kEntryCap - 64 - head.size()) / 6 : 0;  // \u00xx: 6 bytes a char
  if (view.size() > room) view = view.substr(0, room);
  return head + jsonString(view) + "}";
}

// A rank that gave no answer: state "dead" (nothing listens: the process is
// gone), "unreachable" (no handshake in time: frozen, cut off) or "not reached"
// (the request's budget ran out first).
std::string missingJson(Recorder& r, int rank, const std::string& state, const std::string& why) {
  const Identity& id = r.identity();
  std::string w = why.substr(0, 512);
  return "{\"rank\":" + std::to_string(rank) + ",\"state\":" + jsonString(state) + ",\"host\":" +
         jsonString(rank < static_cast<int>(id.hosts.size()) ? id.hosts[rank] : "?") + ",\"pid\":" +
         std::to_string(rank < static_cast<int>(id.pids.size()) ? id.pids[rank] : 0) + ",\"error\":" + jsonString(w) +
         "}";
}

enum class AskResult { kOk, kRefused, kNoHandshake, kFailed };

// One authenticated request to addr; the handshake within hop_s, the answer
// (at most max_answer bytes) before dl.
AskResult ask(const std::string& addr, uint64_t comm, const std::string& key, const std::string& body,
              size_t max_answer, Deadline dl, double hop_s, std::string* answer, std::string* err) {
  int fd = -1;
  AskResult stage = AskResult::kNoHandshake;
  try {
    SockAddr a = SockAddr::parse(addr);
    Deadline hs = Deadline::after(std::min(hop_s, dl.remainingS()));
    try {
      fd = connectTo(a, hs, "job view of " + addr, 0);
    } catch (const Error& e) {
      *err = e.what();
      return std::string(e.what()).find("nothing listens") != std::string::npos ? AskResult::kRefused
                                                                                 : AskResult::kNoHandshake;
    }
    std::string na = crypto::nonce(), hello(kMagic, 4);
    for (int i = 0; i < 8; ++i) hello += static_cast<char>((comm >> (8 * i)) & 0xff);
    hello += na;
    sendAll(fd, hello.data(), hello.size(), hs, "job view hello");
    char got[64];
    if (!recvAll(fd, got, sizeof got, hs, "job view handshake")) throw Error(Error::kPeerFailure, "closed at once");
    const std::string nb(got, 32), ctx = contextOf(comm);
    if (!crypto::equal(std::string(got + 32, 32), crypto::proof(key, 'B', na, nb, ctx))) {
      ::close(fd);
      *err = "the rank does not prove the key (its communicator is gone, or another process listens there)";
      return AskResult::kFailed;
    }
    stage = AskResult::kFailed;
    std::string msg = crypto::proof(key, 'A', nb, na, ctx);
    putU32(msg, static_cast<uint32_t>(body.size()));
    msg += body;
    sendAll(fd, msg.data(), msg.size(), dl, "job view request");
    char len[4];
    if (!recvAll(fd, len, 4, dl, "job view answer")) throw Error(Error::kPeerFailure, "closed without an answer");
    const uint32_t n = getU32(len);
    if (n > max_answer) throw Error(Error::kInternal, "answer of " + std::to_string(n) + " bytes, over the bound");
    answer->assign(n, '\0');
    if (n && !recvAll(fd, answer->data(), n, dl, "job view answer")) throw Error(Error::kPeerFailure, "cut answer");
    ::close(fd);
    return AskResult::kOk;
  } catch (const std::exception& e) {
    if (fd >= 0) ::close(fd);
    *err = e.what();
    return stage;
  }
}

std::string statusOf(Recorder& r, int root, int lo, int hi, Deadline dl);

// Virtual ranks [lo, hi) of r's communicator: the first one asked for its
// part, and on its failure the next, until the part is covered or dl passes.
std::string askRange(Recorder& r, int root, int lo, int hi, Deadline dl) {
  const Identity& id = r.identity();
  const int p = id.size;
  const auto addrs = r.jobAddrs();
  const std::string key = keyOf(r);
  const double hop_s = env::timeout("HARP_JOBVIEW_HOP_S");
  std::string out;
  for (; lo < hi; ++lo) {
    const int rank = (root + lo) % p;
    if (!out.empty()) out += ",";
    if (dl.passed()) {
      out += missingJson(r, rank, "not reached", "the request's time ran out first");
      continue;
    }
    if (rank >= static_cast<int>(addrs.size()) || addrs[rank].empty()) {
      out += missingJson(r, rank, "unreachable", "serves no job view (HARP_JOBVIEW=0 or no listener)");
      continue;
    }
    if (addrs[rank] == ownAddr()) {  // this process: no connection to its own (busy) observer
      if (auto local = find(id.comm_id, rank)) {
        out += statusOf(*local, root, lo, hi, dl);
        return out;
      }
    }
    // The child finishes its part before our deadline: a hop's margin.
    const double left = dl.remainingS();
    const int budget = static_cast<int>(std::max(1.0, (left - std::min(0.25, left / 4)) * 1000));
    std::string body = "STATUS " + std::to_string(root) + " " + std::to_string(lo) + " " + std::to_string(hi) + " " +
                       std::to_string(budget);
    std::string answer, err;
    AskResult res = ask(addrs[rank], id.comm_id, key, body, (hi - lo) * kEntryCap + 64, dl, hop_s, &answer, &err);
    const bool refused = answer.rfind("{\"error\"", 0) == 0;  // busy, or a request it would not serve
    if (res == AskResult::kOk && !refused && !answer.empty() && answer.front() == '{' && answer.back() == '}') {
      out += answer;
      return out;
    }
    if (res == AskResult::kOk) err = "answered " + answer.substr(0, 200);
    const bool busy = refused && answer.rfind("{\"error\":\"busy", 0) == 0;
    out += missingJson(r, rank, res == AskResult::kRefused ? "dead" : busy ? "busy" : "unreachable", err);
  }
  return out;
}

// The entries of virtual ranks [lo, hi), r being virtual rank lo.
std::string statusOf(Recorder& r, int root, int lo, int hi, Deadline dl) {
  std::string own = entryJson(r);
  const int rest = hi - lo - 1;
  if (rest <= 0) return own;
  const int k = static_cast<int>(std::clamp<long long>(env::integer("HARP_JOBVIEW_FANOUT"), 2, 64));
  const int parts = std::min(k, rest);
  std::vector<std::string> got(parts);
  std::vector<std::thread> threads;
  int start = lo + 1;
  for (int i = 0; i < parts; ++i) {
    const int len = rest / parts + (i < rest % parts ? 1 : 0);
    try {
      threads.emplace_back([&r, &got, i, root, start, len, dl] { got[i] = askRange(r, root, start, start + len, dl); });
    } catch (const std::system_error&) {  // no thread to be had: this part on this thread
      got[i] = askRange(r, root, start, start + len, dl);
    }
    start += len;
  }
  for (auto& t : threads) t.join();  // each ends by dl (every wait in it has dl or less)
  for (auto& g : got) own += "," + g;
  return own;
}

bool readInt(const std::string& s, size_t* pos, long long lo, long long hi, long long* v) {
  size_t i = *pos;
  bool neg = i < s.size() && s[i] == '-';
  if (neg) ++i;
  long long x = 0;
  size_t digits = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9' && digits < 12) x = x * 10 + (s[i++] - '0'), ++digits;
  if (!digits || (i < s.size() && s[i] != ' ')) return false;
  x = neg ? -x : x;
  if (x < lo || x > hi) return false;
  *v = x;
  *pos = i < s.size() ? i + 1 : i;
  return true;
}

void sendAnswer(int fd, const std::string& a, Deadline dl) {
  std::string msg;
  putU32(msg, static_cast<uint32_t>(a.size()));
  msg += a;
  sendAll(fd, msg.data(), msg.size(), dl, "job view answer");
}

// A short answer (an error) on a fresh connection: one non-blocking send, which
// a socket with nothing else queued takes whole; never waits.
void sendNow(int fd, const std::string& a) {
  std::string msg;
  putU32(msg, static_cast<uint32_t>(a.size()));
  msg += a;
  ssize_t w = ::send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)w;
}

// --- the server: handshakes on the observer thread, requests on sessions ---
//
// A connection in its handshake is a Conn, stepped by the observer thread
// whenever its socket is ready (never blocking: a client that sends nothing
// costs a slot, not the thread), dropped at its deadline (HARP_JOBVIEW_HOP_S x
// 2 from accept) and, when kMaxPending are waiting, the oldest is dropped for
// a new one: a silent client cannot hold back an honest one, whose handshake
// takes a round trip. Once the client proved the key and its request is read,
// the request runs on a session thread of its own (at most kMaxSessions at
// once; one more is answered "busy"), so a slow request or a fan-out hop never
// waits behind another.
constexpr size_t kMaxPending = 64;  // connections in their handshake (~0.5 KiB each)
constexpr int kMaxSessions = 8;     // authenticated requests served at once (threads)
constexpr int kAcceptBurst = 16;    // connections accepted per wake-up

struct Conn {
  enum Stage { kHelloIn, kReplyOut, kProofIn, kBodyIn } stage = kHelloIn;
  int fd = -1;
  Deadline dl;
  std::string in;  // this stage's bytes so far (at most want)
  size_t want = kHello;
  std::string out;  // kReplyOut: bytes not written yet
  uint64_t comm = 0;
  std::shared_ptr<Recorder> rec;  // null: no such communicator here (the handshake goes on with a random key)
  std::string key, na, nb;
};

struct Server {
  std::mutex mu;                 // conns, session_fds (the fork handlers take it)
  std::vector<Conn> conns;       // the observer thread's, in accept order
  std::vector<int> session_fds;  // connections the sessions hold (a forked child closes its copies)
  int sessions = 0;
};

Server& server() {
  static Server* s = new Server;  // never freed: detached sessions use it until exit
  return *s;
}

// A session: the request of an authenticated client, answered before its budget.
void session(int fd, std::shared_ptr<Recorder> rec, std::string body) {
  env::nameThread("harp-jobview");
  const uint64_t comm = rec->identity().comm_id;
  try {
    Request q;
    std::string err;
    const Deadline send_dl = Deadline::after(5.0);
    if (!parseRequest(body, rec->identity().size, &q, &err)) {
      sendAnswer(fd, "{\"error\":" + jsonString(err) + "}", send_dl);
    } else if (q.kind == Request::kDump) {
      sendAnswer(fd, flightRecordPickle("job view DUMP"), send_dl);
    } else if (q.kind == Request::kAddrs) {
      const Identity& id = rec->identity();
      std::string addrs, hosts;
      auto a = rec->jobAddrs();
      for (size_t i = 0; i < a.size(); ++i) addrs += (i ? "," : "") + jsonString(a[i]);
      for (size_t i = 0; i < id.hosts.size(); ++i) hosts += (i ? "," : "") + jsonString(id.hosts[i]);
      sendAnswer(fd, "{\"comm\":\"" + commHex(comm) + "\",\"rank\":" + std::to_string(id.rank) + ",\"size\":" +
                         std::to_string(id.size) + ",\"addrs\":[" + addrs + "],\"hosts\":[" + hosts + "]}",
                 send_dl);
    } else {
      int root = q.root;
      if (root < 0) root = rec->identity().rank;
      const int target = (root + q.lo) % rec->identity().size;
      auto me = find(comm, target);
      const Deadline dl = Deadline::after(q.budget_ms / 1000.0);
      if (!me) {
        sendAnswer(fd, "{\"error\":\"rank " + std::to_string(target) + " does not live in this process\"}", send_dl);
      } else {
        std::string a = statusOf(*me, root, q.lo, q.hi, dl);
        sendAnswer(fd, a, Deadline::after(dl.remainingS() + 5.0));
      }
    }
  } catch (const std::exception& e) {
    HARP_TRACE("job view request failed: %s", e.what());
  }
  Server& s = server();
  std::lock_guard<std::mutex> g(s.mu);  // closed under the lock: a fork never sees the number reused
  s.session_fds.erase(std::remove(s.session_fds.begin(), s.session_fds.end(), fd), s.session_fds.end());
  ::close(fd);
  --s.sessions;
}

// Under server().mu, observer thread: the request is read; start its session
// (or answer "busy"). Takes c.fd.
void startSession(Server& s, Conn& c, std::string body) {
  const int fd = c.fd;
  c.fd = -1;
  if (s.sessions >= kMaxSessions) {
    sendNow(fd, "{\"error\":\"busy: " + std::to_string(kMaxSessions) + " job-view requests in progress here\"}");
    ::close(fd);
    return;
  }
  try {
    std::thread(session, fd, c.rec, std::move(body)).detach();
  } catch (const std::system_error& e) {
    sendNow(fd, "{\"error\":\"busy: no thread for the request\"}");
    ::close(fd);
    return;
  }
  ++s.sessions;
  s.session_fds.push_back(fd);
}

// Non-blocking reads into c.in up to c.want: true when complete; false when
// the socket has no more now; throws on EOF or an error.
bool fill(Conn& c) {
  while (c.in.size() < c.want) {
    char b[kBodyCap];
    ssize_t r = ::recv(c.fd, b, std::min(sizeof b, c.want - c.in.size()), MSG_DONTWAIT);
    if (r > 0) {
      c.in.append(b, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    throw Error(Error::kPeerFailure, "closed in the handshake");
  }
  return true;
}

// Observer thread, under server().mu: move c on as far as its socket allows.
// False: done with it (closed, or handed to a session).
bool step(Server& s, Conn& c) {
  for (;;) {
    switch (c.stage) {
      case Conn::kHelloIn: {
        if (!fill(c)) return true;
        if (std::memcmp(c.in.data(), kMagic, 4) != 0) return false;
        for (int i = 0; i < 8; ++i) c.comm |= static_cast<uint64_t>(static_cast<unsigned char>(c.in[4 + i])) << (8 * i);
        c.na = c.in.substr(12, crypto::kNonceBytes);
        c.nb = crypto::nonce();
        c.rec = find(c.comm, -1);
        // Without that communicator: random bytes in place of the proof, so the
        // answer says nothing about which communicators live here.
        c.key = c.rec ? keyOf(*c.rec) : crypto::nonce();
        c.out = c.nb + crypto::proof(c.key, 'B', c.na, c.nb, contextOf(c.comm));
        c.stage = Conn::kReplyOut;
        break;
      }
      case Conn::kReplyOut: {
        ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
        if (w < 0) return false;
        c.out.erase(0, static_cast<size_t>(w));
        if (!c.out.empty()) return true;
        c.stage = Conn::kProofIn, c.in.clear(), c.want = 36;
        break;
      }
      case Conn::kProofIn: {
        if (!fill(c)) return true;
        if (!c.rec || !crypto::equal(c.in.substr(0, 32), crypto::proof(c.key, 'A', c.nb, c.na, contextOf(c.comm))))
          return false;  // a wrong proof: closed, no answer
        const uint32_t n = getU32(c.in.data() + 32);
        if (n > kBodyCap) {
          sendNow(c.fd, "{\"error\":\"request over " + std::to_string(kBodyCap) + " bytes\"}");
          return false;
        }
        c.stage = Conn::kBodyIn, c.in.clear(), c.want = n;
        break;
      }
      case Conn::kBodyIn: {
        if (!fill(c)) return true;
        startSession(s, c, std::move(c.in));
        return false;
      }
    }
  }
}

// The connection's turn: step it, catching what its socket throws.
bool turn(Server& s, Conn& c) {
  try {
    return step(s, c);
  } catch (const std::exception& e) {
    HARP_TRACE("job view handshake failed: %s", e.what());
    return false;
  }
}

}  // namespace

bool parseRequest(const std::string& body, int size, Request* out, std::string* err) {
  Request q;
  if (body == "ADDRS" || body == "DUMP") {
    q.kind = body == "ADDRS" ? Request::kAddrs : Request::kDump;
    *out = q;
    return true;
  }
  if (body.rfind("STATUS ", 0) != 0) {
    *err = "unknown request: send STATUS <root> <lo> <hi> <budget_ms>, ADDRS or DUMP";
    return false;
  }
  size_t pos = 7;
  long long root, lo, hi, ms;
  if (!readInt(body, &pos, -1, size - 1, &root) || !readInt(body, &pos, 0, size - 1, &lo) ||
      !readInt(body, &pos, lo + 1, size, &hi) || !readInt(body, &pos, 1, 60000, &ms) || pos != body.size() ||
      body.back() == ' ') {
    *err = "malformed STATUS: want <root -1.." + std::to_string(size - 1) + "> <lo> <hi> (0 <= lo < hi <= " +
           std::to_string(size) + ") <budget_ms 1..60000>, one space apart";
    return false;
  }
  if (root < 0 && lo != 0) {
    *err = "malformed STATUS: root -1 (the server's rank) needs lo 0";
    return false;
  }
  q.root = static_cast<int>(root), q.lo = static_cast<int>(lo), q.hi = static_cast<int>(hi);
  q.budget_ms = static_cast<int>(ms);
  *out = q;
  return true;
}

void join(Recorder& r) {
  const Identity& id = r.identity();
  if (!env::flag("HARP_JOBVIEW") || id.secret.empty()) return;
  std::string mine;
  {
    Listener& l = listener();
    std::lock_guard<std::mutex> g(l.mu);
    if (l.fd < 0) {
      try {
        std::string host = id.bind_host.empty() ? "127.0.0.1" : id.bind_host;
        if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        SockAddr a = SockAddr::parse(host, 0);
        const long long port = env::integer("HARP_JOBVIEW_PORT");
        a.setPort(static_cast<int>(std::clamp<long long>(port, 0, 65535)));
        int fd = -1;
        try {
          fd = listenOn(a, 64);
        } catch (const Error& e) {
          if (port == 0) throw;
          HARP_WARN("job view: port %lld taken (%s): any free port instead", port, e.what());
          a.setPort(0);
          fd = listenOn(a, 64);
        }
        ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        setNonBlocking(fd, true);
        l.fd = fd;
        l.addr = a.str();
        l.poll_fd.store(fd);
        wakeObserver();
      } catch (const std::exception& e) {
        HARP_WARN("job view off: no listener (%s)", e.what());
      }
    }
    mine = l.addr;
  }
  auto store = r.store();
  if (!store) return;
  if (id.size == 1) return r.setJobAddrs({mine});
  try {
    r.setJobAddrs(storeAllgather(*store, "jobview", id.rank, id.size, mine, std::min(id.timeout_s, 30.0)));
  } catch (const std::exception& e) {
    HARP_WARN("job view off for comm %s: the address exchange failed (%s)", commHex(id.comm_id).c_str(), e.what());
  }
}

int listenFd() { return listener().poll_fd.load(); }

void atforkPrepare() {
  listener().mu.lock();
  server().mu.lock();
}
void atforkParent() {
  server().mu.unlock();
  listener().mu.unlock();
}
void atforkChild() {
  Listener& l = listener();
  if (l.fd >= 0) ::close(l.fd);  // the parent's listener and connections stay the parent's
  l.fd = -1;
  l.addr.clear();
  l.poll_fd.store(-1);
  Server& s = server();
  for (auto& c : s.conns) ::close(c.fd);
  for (int fd : s.session_fds) ::close(fd);
  s.conns.clear();
  s.session_fds.clear();
  s.sessions = 0;  // no session thread crossed the fork
  s.mu.unlock();
  l.mu.unlock();
}

int pollSet(std::vector<pollfd>* p) {
  Server& s = server();
  std::lock_guard<std::mutex> g(s.mu);
  int ms = -1;
  for (auto& c : s.conns) {
    p->push_back({c.fd, static_cast<short>(c.stage == Conn::kReplyOut ? POLLOUT : POLLIN), 0});
    const int left = c.dl.remainingMs() + 1;  // poll's ms round down: wake after the deadline, not before
    ms = ms < 0 ? left : std::min(ms, left);
  }
  return ms;
}

void serve(int listen_fd, bool readable, const pollfd* ready, size_t n) {
  Server& s = server();
  std::lock_guard<std::mutex> g(s.mu);
  // The connections polled (pollSet's order; only this thread changes the list).
  std::vector<Conn> keep;
  keep.reserve(s.conns.size() + kAcceptBurst);
  for (size_t i = 0; i < s.conns.size(); ++i) {
    Conn& c = s.conns[i];
    const bool go = i < n && ready[i].fd == c.fd && ready[i].revents != 0;
    if ((go && !turn(s, c)) || (c.fd >= 0 && c.dl.passed())) {
      if (c.fd >= 0) ::close(c.fd);
      continue;
    }
    keep.push_back(std::move(c));
  }
  s.conns = std::move(keep);
  if (!readable || listen_fd < 0) return;
  const double hs_s = env::timeout("HARP_JOBVIEW_HOP_S") * 2;
  for (int k = 0; k < kAcceptBurst; ++k) {
    int cfd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (cfd < 0) return;
    setNoDelay(cfd);
    if (s.conns.size() >= kMaxPending) {  // the oldest waiting handshake makes room
      ::close(s.conns.front().fd);
      s.conns.erase(s.conns.begin());
    }
    Conn c;
    c.fd = cfd;
    c.dl = Deadline::after(hs_s);
    if (turn(s, c)) s.conns.push_back(std::move(c));  // its hello may be there already
    else if (c.fd >= 0) ::close(c.fd);
  }
}

std::string endpointsJson() {
  std::string o = "{\"endpoints\":[";
  bool first = true;
  const std::string addr = ownAddr();
  for (auto& r : liveRecorders()) {
    const Identity& id = r->identity();
    if (id.secret.empty() || addr.empty()) continue;
    o += (first ? "" : ",");
    first = false;
    o += "{\"comm\":\"" + commHex(id.comm_id) + "\",\"rank\":" + std::to_string(id.rank) + ",\"size\":" +
         std::to_string(id.size) + ",\"addr\":" + jsonString(addr) + ",\"key\":\"" + hex(keyOf(*r)) + "\"}";
  }
  return o + "]}";
}

}  // namespace jobview
}  // namespace harp::obs
