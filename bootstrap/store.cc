// TcpStore wire protocol (all integers little-endian; limits in store.h).
//
// Hello: a mutual challenge-response keyed by K = crypto::deriveKey(job
// secret, "store"), context "harp-store", in which the CLIENT PROVES FIRST:
//   client -> server  "HARPSTR3" | na (32 B random)
//   server -> client  nb (32 B random)
//   client -> server  proof(K, 'A', nb, na, ctx)                      (32 B)
//   server -> client  u8 1 | proof(K, 'B', na, nb, ctx)  (32 B)   proof verified
//                   | u8 0, then the server hangs up              proof wrong
// So a connector that does not know the secret receives a random nonce and a
// refusal, nothing that depends on the secret: it cannot test guesses of a
// weak secret offline, only one guess per connection, each logged on the root.
// The client checks the server's proof before sending any request (a root
// that cannot prove the secret is not trusted). The secret never travels; a
// recorded hello cannot be replayed (each side's proof covers the other's
// fresh nonce). The whole hello must finish within kHelloDeadlineS of the
// connect. A connection the server closes before its verdict (u8 0 / 1) was
// shed under load, not refused: the client dials again until its deadline.
//
// Pending hellos (connections not yet authenticated) are bounded
// (kMaxPendingHellos). When a new connection needs room, the server drops one
// of the source address (IPv4 address, IPv6 /64) that holds the most pending
// hellos, so a flooder only pushes out its own connections; within that
// source, silent or partial first messages go before clients waiting for
// their proof to be checked, oldest first.
//
// Request:  u8 cmd | u32 klen | key | u32 vlen | value
//   (klen <= kMaxKeyBytes, vlen <= kMaxValueBytes; else the client is dropped)
//   1 SET              -> u8 1
//   2 GET   value = u32 timeout_ms [| keys: more keys to wait for]
//                      -> u8 0 (none of the keys appeared before timeout_ms)
//                       | u8 1+i (key i exists) | u32 vlen | value
//                      The server answers at its own deadline, so a client
//                      never abandons a reply in flight.
//   3 ADD   value = i64 delta -> i64 new value (an absent key counts as 0)
//   4 CHECK value = keys -> u32 n | n x u8 (1 = the key exists)
//   5 ONCLOSE value = v: when this client disconnects, set key = v unless the
//                      key exists (empty v cancels) -> u8 1
//   6 SETNX            -> u8 1 if set, 0 if the key existed
//   7 FORMED           -> u8 1 (a communicator formed; see TcpStoreServer)
// keys := u32 n (<= 64) | n x (u32 len | key)
// Any other command, or a request over a limit, disconnects the client.
#include "bootstrap/store.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>

#include "bootstrap/crypto.h"
#include "base/env.h"
#include "base/log.h"
#include "base/types.h"

namespace harp {
namespace store_wire {
namespace {
void put32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
uint32_t get32(const std::string& s, size_t off) {
  uint32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}
constexpr size_t kMaxKeysPerRequest = 64;
}  // namespace

std::string encode(uint8_t cmd, const std::string& key, const std::string& value) {
  std::string m(1, static_cast<char>(cmd));
  put32(m, static_cast<uint32_t>(key.size()));
  m += key;
  put32(m, static_cast<uint32_t>(value.size()));
  return m + value;
}

std::string encodeKeys(const std::vector<std::string>& keys) {
  std::string s;
  put32(s, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    put32(s, static_cast<uint32_t>(k.size()));
    s += k;
  }
  return s;
}

bool decodeKeys(const std::string& s, size_t off, std::vector<std::string>* out) {
  if (s.size() < off || s.size() - off < 4) return false;
  uint32_t n = get32(s, off);
  off += 4;
  if (n > kMaxKeysPerRequest) return false;
  for (uint32_t i = 0; i < n; ++i) {
    if (s.size() - off < 4) return false;
    size_t len = get32(s, off);
    off += 4;
    if (len > kMaxKeyBytes || s.size() - off < len) return false;
    out->push_back(s.substr(off, len));
    off += len;
  }
  return off == s.size();
}

long parse(const std::string& in, uint8_t* cmd, std::string* key, std::string* value) {
  if (in.empty()) return 0;
  uint8_t c = static_cast<uint8_t>(in[0]);
  if (c < kSet || c > kFormed) return -1;
  if (in.size() < 5) return 0;
  size_t klen = get32(in, 1);
  if (klen > kMaxKeyBytes) return -1;
  if (in.size() - 5 < klen + 4) return 0;  // sizes are bounded: no overflow
  size_t vlen = get32(in, 5 + klen);
  if (vlen > kMaxValueBytes) return -1;
  size_t total = 9 + klen + vlen;
  if (in.size() < total) return 0;
  *cmd = c;
  key->assign(in, 5, klen);
  value->assign(in, 9 + klen, vlen);
  return static_cast<long>(total);
}
}  // namespace store_wire

using namespace store_wire;

namespace {
const std::string kContext = "harp-store";
constexpr size_t kMaxRequestBytes = 9 + kMaxKeyBytes + kMaxValueBytes;
constexpr size_t kMaxOutBytes = 2 * kMaxValueBytes + (1u << 20);

std::string u8(uint8_t v) { return std::string(1, static_cast<char>(v)); }

// The unit a flooder cannot multiply cheaply: an IPv4 address, an IPv6 /64
// (an IPv4-mapped IPv6 address counts as its IPv4 address).
std::string sourceOf(const SockAddr& a) {
  if (a.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a.ss);
    return std::string(reinterpret_cast<const char*>(&in->sin_addr), 4);
  }
  if (a.family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    const char* b = reinterpret_cast<const char*>(&in6->sin6_addr);
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) ? std::string(b + 12, 4) : std::string(b, 8);
  }
  return std::string();
}
}  // namespace

// ---------------------------------------------------------------------------
// Server

struct TcpStoreServer::State {
  enum Stage { kNonce, kProof, kAuthed };
  struct Client {
    int fd = -1;
    SockAddr addr;
    std::string source;  // sourceOf(addr): what the pending-hello share is counted by
    Stage stage = kNonce;
    Clock::time_point hello_by;
    std::string na, nb, in, out;
    std::vector<std::pair<std::string, std::string>> on_close;
    bool dead = false;
  };
  struct Waiter {
    Client* c;
    std::vector<std::string> keys;
    Clock::time_point until;
  };
  TcpStoreServer& s;
  std::list<Client> clients;  // stable addresses
  std::list<Waiter> waiters;
  std::map<std::string, std::string> kv;
  size_t stored = 0, buffered = 0;
  bool formed = false;
  Clock::time_point listen_paused_until{};
  bool emfile_logged = false;

  explicit State(TcpStoreServer& srv) : s(srv) {}

  void drop(Client& c, const char* why, bool warn) {
    if (c.dead) return;
    if (warn) HARP_WARN("bootstrap store: disconnected %s: %s", c.addr.str().c_str(), why);
    else HARP_INFO("bootstrap store: disconnected %s: %s", c.addr.str().c_str(), why);
    c.dead = true;
  }
  void refuse(Client& c, const char* why) {
    int n = ++s.refused_;
    if (n <= 10 || n % 100 == 0)
      HARP_WARN("refused bootstrap connection from %s: %s (%d refused so far)", c.addr.str().c_str(), why, n);
    c.dead = true;
  }
  void send(Client& c, const std::string& data) {
    if (c.dead) return;
    if (c.out.size() + data.size() > kMaxOutBytes) return drop(c, "it does not read its replies", true);
    c.out += data;
    flush(c);
  }
  void flush(Client& c) {
    while (!c.out.empty() && !c.dead) {
      ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        c.out.erase(0, w);
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        c.dead = true;
      }
    }
  }
  void put(const std::string& key, const std::string& val) {
    auto it = kv.find(key);
    if (it != kv.end()) {
      stored -= it->second.size();
      it->second = val;
    } else {
      stored += key.size();
      kv.emplace(key, val);
    }
    stored += val.size();
    wake(key, val);
  }
  void wake(const std::string& key, const std::string& val) {
    for (auto it = waiters.begin(); it != waiters.end();) {
      auto k = std::find(it->keys.begin(), it->keys.end(), key);
      if (k == it->keys.end()) { ++it; continue; }
      std::string r = u8(static_cast<uint8_t>(1 + (k - it->keys.begin())));
      store_wire::put32(r, static_cast<uint32_t>(val.size()));
      send(*it->c, r + val);
      it = waiters.erase(it);
    }
  }
  bool fits(const std::string& key, const std::string& val) {
    auto it = kv.find(key);
    size_t old = it == kv.end() ? 0 : key.size() + it->second.size();
    return stored - old + key.size() + val.size() <= kMaxStoreBytes;
  }

  size_t pending() const {
    size_t n = 0;
    for (auto& o : clients) n += o.stage != kAuthed && !o.dead;
    return n;
  }
  // Drops n pending hellos: each time one of the source holding the most,
  // silent or partial ones (kNonce) before those awaiting their proof's
  // check, the oldest first (see the file comment). Returns how many.
  size_t evict(size_t n, const char* why) {
    std::map<std::string, size_t> per_source;
    for (auto& o : clients)
      if (o.stage != kAuthed && !o.dead) ++per_source[o.source];
    size_t done = 0;
    for (; done < n; ++done) {
      Client* victim = nullptr;
      for (auto& o : clients) {  // oldest first: a later one must beat it strictly
        if (o.stage == kAuthed || o.dead) continue;
        if (!victim || per_source[o.source] > per_source[victim->source] ||
            (per_source[o.source] == per_source[victim->source] && o.stage == kNonce && victim->stage != kNonce))
          victim = &o;
      }
      if (!victim) break;
      --per_source[victim->source];
      ++s.dropped_;
      drop(*victim, why, false);
    }
    return done;
  }

  void accept();
  void readFrom(Client& c);
  bool hello(Client& c);
  void serve(Client& c);
  void request(Client& c, uint8_t cmd, const std::string& key, const std::string& val);
  void reap();
  int pollTimeoutMs();
};

TcpStoreServer::TcpStoreServer(SockAddr bind_addr, std::string secret) : addr_(bind_addr) {
  secret.resize(kSecretBytes, '\0');
  key_ = crypto::deriveKey(secret, "store");
  listen_fd_ = listenOn(addr_, 1024);
  setNonBlocking(listen_fd_, true);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    int e = errno;
    ::close(listen_fd_);
    throw ErrnoError("eventfd", e);
  }
  thread_ = std::thread([this] {
    env::nameThread("harp-store");
    loop();
  });
}

void TcpStoreServer::wake() {
  std::lock_guard<std::mutex> g(wake_mu_);
  if (wake_fd_ < 0) return;  // the thread has ended
  uint64_t one = 1;
  ssize_t w = ::write(wake_fd_, &one, 8);
  (void)w;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
}

bool TcpStoreServer::retireWhenIdle(double wait_s) {
  retire_ = true;
  wake();
  Deadline dl = Deadline::after(wait_s);
  while (!finished_ && !retire_seen_ && !dl.passed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return finished_;
}

void TcpStoreServer::State::accept() {
  for (int i = 0; i < 64; ++i) {
    Client c;
    c.addr.len = sizeof c.addr.ss;
    c.fd = ::accept4(s.listen_fd_, reinterpret_cast<sockaddr*>(&c.addr.ss), &c.addr.len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c.fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: make room by dropping the older half of the
        // unauthenticated connections and accept again; if there are none to
        // drop, stop polling the listener for a while (never spin on it).
        if (!emfile_logged)
          HARP_WARN("bootstrap store: accept failed (%s); dropping the oldest unauthenticated connections "
                    "(logged once)", std::strerror(errno));
        emfile_logged = true;
        size_t dropped = evict((pending() + 1) / 2, "out of file descriptors; dropped a pending hello");
        if (dropped) reap();  // closes them now
        else listen_paused_until = Clock::now() + std::chrono::milliseconds(200);
        if (dropped) continue;
      }
      return;  // EAGAIN, ECONNABORTED, EINTR, ...: next poll
    }
    setNoDelay(c.fd);
    c.hello_by = Clock::now() + std::chrono::milliseconds(static_cast<int>(kHelloDeadlineS * 1000));
    c.source = sourceOf(c.addr);
    clients.push_back(std::move(c));
    readFrom(clients.back());  // a hello already here counts as one, not as a silent connection
    if (pending() > kMaxPendingHellos) evict(1, "too many pending hellos; dropped one of the address holding most");
  }
}

// Drives the hello (the client proves first, see the file comment); returns
// true once the client is authenticated.
bool TcpStoreServer::State::hello(Client& c) {
  if (c.stage == kNonce) {
    size_t have = std::min(c.in.size(), sizeof kHello);
    if (std::memcmp(c.in.data(), kHello, have) != 0) {
      refuse(c, "not a HARP store hello (or one of another HARP version)");
      return false;
    }
    if (c.in.size() < 8 + crypto::kNonceBytes) return false;
    c.na = c.in.substr(8, crypto::kNonceBytes);
    c.nb = crypto::nonce();
    c.in.clear();
    c.stage = kProof;
    send(c, c.nb);  // nothing that depends on the secret before the client's proof
    return false;
  }
  if (c.in.size() < crypto::kDigestBytes) return false;
  if (!crypto::equal(c.in.substr(0, crypto::kDigestBytes), crypto::proof(s.key_, 'A', c.nb, c.na, kContext))) {
    // The verdict, so that the client reports a refusal instead of dialing again.
    ssize_t w = ::send(c.fd, "\0", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    refuse(c, "it did not prove knowledge of this job's secret (wrong unique id / HARP_SECRET?)");
    return false;
  }
  c.in.clear();
  c.stage = kAuthed;
  send(c, u8(1) + crypto::proof(s.key_, 'B', c.na, c.nb, kContext));
  return true;
}

void TcpStoreServer::State::readFrom(Client& c) {
  // Unauthenticated clients may send exactly the hello's bytes; authenticated
  // ones up to one maximal request beyond what is parsed.
  size_t want = c.stage == kNonce ? 8 + crypto::kNonceBytes : c.stage == kProof ? crypto::kDigestBytes
                                                                                  : kMaxRequestBytes;
  if (c.in.size() >= want) return drop(c, "request over the size limit", true);
  size_t room = std::min<size_t>(want - c.in.size(), 1 << 16);
  if (c.stage == kAuthed && buffered + room > kMaxStoreBytes)
    return drop(c, "the store's input budget is exhausted", true);
  char buf[1 << 16];
  ssize_t r = ::recv(c.fd, buf, room, MSG_DONTWAIT);
  if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    c.dead = true;  // before its proof: a scan, a flood, or a client that gave up
    return;
  }
  if (r < 0) return;
  c.in.append(buf, r);
  if (c.stage != kAuthed) {
    if (!hello(c) || c.in.empty()) return;
  }
  serve(c);
}

void TcpStoreServer::State::serve(Client& c) {
  for (;;) {
    uint8_t cmd = 0;
    std::string key, val;
    long n = parse(c.in, &cmd, &key, &val);
    if (n < 0) return drop(c, "malformed request (unknown command or a length over its limit)", true);
    if (n == 0) return;
    c.in.erase(0, static_cast<size_t>(n));
    request(c, cmd, key, val);
    if (c.dead) return;
  }
}

void TcpStoreServer::State::request(Client& c, uint8_t cmd, const std::string& key, const std::string& val) {
  switch (cmd) {
    case kSet:
    case kSetNx: {
      bool exists = kv.count(key) != 0;
      if (cmd == kSetNx && exists) return send(c, u8(0));
      if (!fits(key, val)) return drop(c, "the store is full (kMaxStoreBytes)", true);
      put(key, val);
      return send(c, u8(1));
    }
    case kGet: {
      Waiter w{&c, {key}, {}};
      if (val.size() < 4 || (val.size() > 4 && !decodeKeys(val, 4, &w.keys)))
        return drop(c, "malformed GET", true);
      for (size_t i = 0; i < w.keys.size(); ++i) {
        auto it = kv.find(w.keys[i]);
        if (it == kv.end()) continue;
        std::string r = u8(static_cast<uint8_t>(1 + i));
        store_wire::put32(r, static_cast<uint32_t>(it->second.size()));
        return send(c, r + it->second);
      }
      uint32_t ms = store_wire::get32(val, 0);
      w.until = Clock::now() + std::chrono::milliseconds(ms);
      waiters.push_back(std::move(w));
      return;
    }
    case kAdd: {
      if (val.size() != 8) return drop(c, "malformed ADD", true);
      int64_t delta, cur = 0;
      std::memcpy(&delta, val.data(), 8);
      auto it = kv.find(key);
      if (it != kv.end() && it->second.size() == 8) std::memcpy(&cur, it->second.data(), 8);
      cur = static_cast<int64_t>(static_cast<uint64_t>(cur) + static_cast<uint64_t>(delta));  // wraps, no UB
      std::string v(reinterpret_cast<char*>(&cur), 8);
      if (!fits(key, v)) return drop(c, "the store is full (kMaxStoreBytes)", true);
      put(key, v);
      return send(c, v);
    }
    case kCheck: {
      std::vector<std::string> keys;
      if (!decodeKeys(val, 0, &keys)) return drop(c, "malformed CHECK", true);
      std::string r;
      store_wire::put32(r, static_cast<uint32_t>(keys.size()));
      for (const auto& k : keys) r += u8(kv.count(k) ? 1 : 0);
      return send(c, r);
    }
    case kOnClose: {
      auto& oc = c.on_close;
      oc.erase(std::remove_if(oc.begin(), oc.end(), [&](auto& p) { return p.first == key; }), oc.end());
      if (!val.empty()) {
        if (oc.size() >= 16) return drop(c, "too many ONCLOSE keys", true);
        oc.emplace_back(key, val);
      }
      return send(c, u8(1));
    }
    case kFormed:
      formed = true;
      return send(c, u8(1));
    default:
      return drop(c, "unknown command", true);
  }
}

// Removes dead clients (firing their ONCLOSE keys) and expired hellos/waits.
void TcpStoreServer::State::reap() {
  auto now = Clock::now();
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->c->dead) { it = waiters.erase(it); continue; }
    if (it->until <= now) {
      send(*it->c, u8(0));
      it = waiters.erase(it);
      continue;
    }
    ++it;
  }
  for (auto& c : clients)
    if (c.stage != kAuthed && !c.dead && c.hello_by <= now) {
      ++s.dropped_;
      drop(c, "no complete hello within the deadline", false);
    }
  buffered = 0;
  for (auto it = clients.begin(); it != clients.end();) {
    if (!it->dead) {
      buffered += it->in.size();
      ++it;
      continue;
    }
    for (auto w = waiters.begin(); w != waiters.end();) w = w->c == &*it ? waiters.erase(w) : std::next(w);
    auto on_close = std::move(it->on_close);
    ::close(it->fd);
    it = clients.erase(it);
    for (auto& [k, v] : on_close)
      if (!kv.count(k) && fits(k, v)) put(k, v);
  }
}

int TcpStoreServer::State::pollTimeoutMs() {
  auto now = Clock::now();
  auto next = now + std::chrono::seconds(60);
  for (auto& w : waiters) next = std::min(next, w.until);
  for (auto& c : clients)
    if (c.stage != kAuthed) next = std::min(next, c.hello_by);
  if (listen_paused_until > now) next = std::min(next, listen_paused_until);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::max<long long>(0, ms) + 1);
}

void TcpStoreServer::loop() {
  State st(*this);
  std::vector<pollfd> pfds;
  std::vector<State::Client*> order;
  for (;;) {
    bool listening = st.listen_paused_until <= Clock::now();
    pfds.assign({{wake_fd_, POLLIN, 0}, {listening ? listen_fd_ : -1, POLLIN, 0}});
    order.clear();
    for (auto& c : st.clients) {
      pfds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      order.push_back(&c);
    }
    int pr = ::poll(pfds.data(), pfds.size(), st.pollTimeoutMs());
    if (pr < 0 && errno != EINTR) break;
    if (stop_) break;
    if (pr > 0 && pfds[0].revents) {
      uint64_t n;
      ssize_t r = ::read(wake_fd_, &n, 8);  // a retireWhenIdle() request: checked below
      (void)r;
    }
    if (pr > 0) {
      for (size_t i = 0; i < order.size(); ++i) {
        short ev = pfds[i + 2].revents;
        if (!ev || order[i]->dead) continue;
        if (ev & POLLOUT) st.flush(*order[i]);
        if (ev & (POLLIN | POLLHUP | POLLERR)) st.readFrom(*order[i]);
      }
      if (pfds[1].revents & POLLIN) st.accept();
    }
    st.reap();
    bool authed = false;
    for (auto& c : st.clients) authed |= c.stage == State::kAuthed;
    if ((st.formed || retire_) && !authed) break;  // served its communicator, or let go; nobody left
    if (retire_) retire_seen_ = true;  // busy: retires once its clients have gone
  }
  for (auto& c : st.clients) ::close(c.fd);
  // Stop listening for every holder of this socket (a fork()ed child keeps a
  // copy): later connects are refused at once instead of queueing unanswered.
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  listen_fd_ = -1;
  {
    std::lock_guard<std::mutex> g(wake_mu_);
    ::close(wake_fd_);
    wake_fd_ = -1;
  }
  HARP_INFO("bootstrap store on %s closed", addr_.str().c_str());
  finished_ = true;
}

// ---------------------------------------------------------------------------
// Client

TcpStore::TcpStore(const SockAddr& server, std::string secret, double timeout_s, double refused_s) : server_(server) {
  secret.resize(kSecretBytes, '\0');
  std::string key = crypto::deriveKey(secret, "store");
  Deadline dl = Deadline::after(timeout_s);
  std::string what = "the HARP bootstrap root at " + server.str();
  for (int attempt = 1;; ++attempt) {
    fd_ = connectTo(server, dl, "the HARP bootstrap root", refused_s);
    setNoDelay(fd_);
    local_ = localAddrOf(fd_);
    std::string why = hello(key, dl, what);
    if (why.empty()) return;
    closeFd();
    if (dl.passed())
      throw Error(Error::kTimeout, what + " closed the connection during the hello " + std::to_string(attempt) +
                                       " times in " + formatSeconds(timeout_s) + " s (last: " + why +
                                       "): it is flooded or overloaded, or it is not a HARP root of this version");
    if (attempt == 10 || attempt % 100 == 0)
      HARP_WARN("%s keeps closing the connection during the hello (%s; %d tries); dialing again", what.c_str(),
                why.c_str(), attempt);
    int ms = std::min({200, 5 * attempt, dl.remainingMs()});
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

std::string TcpStore::hello(const std::string& key, Deadline dl, const std::string& what) {
  std::string na = crypto::nonce(), nb(crypto::kNonceBytes, '\0');
  try {
    sendAll(fd_, (std::string(kHello, 8) + na).data(), 8 + na.size(), dl, what);
    if (!recvAll(fd_, nb.data(), nb.size(), dl, what)) return "closed before its challenge";
    std::string mine = crypto::proof(key, 'A', nb, na, kContext);
    sendAll(fd_, mine.data(), mine.size(), dl, what);
    char verdict = 0;
    if (!recvAll(fd_, &verdict, 1, dl, what)) return "closed before its verdict";
    if (verdict != 1) {
      closeFd();
      throw Error(Error::kPeerFailure, what + " refused this process: it did not accept this process's proof of the "
                                              "job secret (wrong unique id / HARP_SECRET, or a different job's root)");
    }
    std::string theirs(crypto::kDigestBytes, '\0');
    if (!recvAll(fd_, theirs.data(), theirs.size(), dl, what)) return "closed before it proved the secret";
    if (!crypto::equal(theirs, crypto::proof(key, 'B', na, nb, kContext))) {
      closeFd();
      throw Error(Error::kPeerFailure, "refused " + what + ": it did not prove knowledge of this job's secret "
                                       "(wrong unique id / secret, a different job's root, or not a HARP root)");
    }
    return "";
  } catch (const Error& e) {
    if (fd_ < 0 || e.kind() != Error::kPeerFailure) throw;  // a verdict, or the deadline
    return e.what();  // reset or cut mid-message: shed
  }
}

TcpStore::~TcpStore() { close(); }

void TcpStore::close() {
  std::lock_guard<std::mutex> g(mu_);
  closeFd();
}

void TcpStore::closeFd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string TcpStore::readReply(uint8_t cmd, Deadline dl, const std::string& what) {
  auto need = [&](void* p, size_t n) {
    if (!recvAll(fd_, p, n, dl, what)) throw Error(Error::kPeerFailure, what + " closed the connection");
  };
  if (cmd == kAdd) {
    std::string out(8, '\0');
    need(out.data(), 8);
    return out;
  }
  if (cmd == kCheck) {
    uint32_t n;
    need(&n, 4);
    if (n > 64) throw Error(Error::kPeerFailure, what + " sent a malformed CHECK reply");
    std::string bits(n, '\0');
    if (n) need(bits.data(), n);
    return bits;
  }
  uint8_t status = 0;
  need(&status, 1);
  std::string out(1, static_cast<char>(status));
  if (cmd != kGet || status == 0) return out;
  uint32_t len;
  need(&len, 4);
  if (len > kMaxValueBytes)
    throw Error(Error::kPeerFailure, what + " sent a value of " + std::to_string(len) + " bytes (limit " +
                                         std::to_string(kMaxValueBytes) + ")");
  std::string v(len, '\0');
  if (len) need(v.data(), len);
  return out + v;
}

std::string TcpStore::request(uint8_t cmd, const std::string& key, const std::string& value, double timeout_s) {
  std::string what = "the HARP bootstrap root at " + server_.str();
  std::lock_guard<std::mutex> g(mu_);
  if (fd_ < 0) throw Error(Error::kPeerFailure, "the connection to " + what + " is closed");
  if (key.size() > kMaxKeyBytes)
    throw InvalidArgument("store key of " + std::to_string(key.size()) + " bytes (limit " +
                          std::to_string(kMaxKeyBytes) + ")");
  if (value.size() > kMaxValueBytes)
    throw InvalidArgument("store value of " + std::to_string(value.size()) + " bytes (limit " +
                          std::to_string(kMaxValueBytes) + ")");
  std::string msg = encode(cmd, key, value);
  Deadline dl = Deadline::after(timeout_s);
  try {
    sendAll(fd_, msg.data(), msg.size(), dl, what);
    return readReply(cmd, dl, what);
  } catch (const Error&) {
    closeFd();  // a reply may still be in flight: never reuse a desynchronised connection
    throw;
  }
}

void TcpStore::set(const std::string& key, const std::string& value) { request(kSet, key, value, 60); }

bool TcpStore::setIfAbsent(const std::string& key, const std::string& value) {
  return request(kSetNx, key, value, 60).at(0) == 1;
}

int TcpStore::waitAny(const std::vector<std::string>& keys, double timeout_s, std::string* value) {
  Deadline dl = Deadline::after(timeout_s);
  std::vector<std::string> more(keys.begin() + 1, keys.end());
  for (;;) {
    // Server-side wait in slices of at most an hour (u32 milliseconds).
    int ms = std::min(dl.remainingMs(), 3600 * 1000);
    std::string v(reinterpret_cast<const char*>(&ms), 4);
    if (!more.empty()) v += encodeKeys(more);
    std::string r = request(kGet, keys.at(0), v, ms / 1000.0 + 30);
    uint8_t status = static_cast<uint8_t>(r.at(0));
    if (status > keys.size()) throw Error(Error::kPeerFailure, "the HARP bootstrap root sent a malformed reply");
    if (status > 0) {
      *value = r.substr(1);
      return status - 1;
    }
    if (dl.passed()) return -1;
  }
}

std::string TcpStore::get(const std::string& key, double timeout_s) {
  std::string v;
  if (waitAny({key}, timeout_s, &v) < 0)
    throw Error(Error::kTimeout, "timed out after " + formatSeconds(timeout_s) + " s waiting for key '" + key +
                                     "' in the HARP bootstrap store at " + server_.str() +
                                     " (did every rank start, with the same unique id and world size?)");
  return v;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string v = request(kAdd, key, std::string(reinterpret_cast<char*>(&delta), 8), 60);
  int64_t out;
  std::memcpy(&out, v.data(), 8);
  return out;
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys) {
  std::vector<bool> out;
  for (size_t i = 0; i < keys.size(); i += 64) {
    std::vector<std::string> part(keys.begin() + i, keys.begin() + std::min(keys.size(), i + 64));
    std::string bits = request(kCheck, "", encodeKeys(part), 60);
    if (bits.size() != part.size()) throw Error(Error::kPeerFailure, "the HARP bootstrap root sent a malformed reply");
    for (char b : bits) out.push_back(b != 0);
  }
  return out;
}

void TcpStore::setOnClose(const std::string& key, const std::string& value) { request(kOnClose, key, value, 60); }

void TcpStore::formed() { request(kFormed, "", "", 60); }

SockAddr TcpStore::localAddress() const { return local_; }

}  // namespace harp
