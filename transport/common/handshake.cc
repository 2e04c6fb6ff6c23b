// transport/common/handshake.cc — see handshake.h for the protocol and the rules.
#include "transport/common/handshake.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "bootstrap/crypto.h"
#include "base/env.h"
#include "base/log.h"
#include "base/types.h"

namespace harp::transport {

struct Handshake::Conn {
  int fd = -1;
  bool outgoing = false;
  int peer = -1, index = 0;
  int state = 0;  // outgoing: 0 connecting, 1 awaiting CHALLENGE, 2 waiting to redial
                  // incoming: 0 awaiting HELLO, 1 awaiting RESPONSE
  std::string buf, na, nb;
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string addr_text;  // outgoing: where we dial; incoming: who connected
  Clock::time_point started{}, retry_at{}, refused_since{};
  bool refusing = false;
  int redials = 0;
};

namespace {
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string u32le(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string u64le(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
uint32_t getU32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
uint64_t getU64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

// The whole message or nothing: the messages are tiny and the socket is fresh,
// so a short write means a broken connection.
bool sendMsg(int fd, const std::string& m) {
  ssize_t w;
  do w = ::send(fd, m.data(), m.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  return w == static_cast<ssize_t>(m.size());
}

std::string addrText(const sockaddr_storage& ss, socklen_t len) {
  if (ss.ss_family == AF_UNIX) return "a local process";
  SockAddr a;
  a.ss = ss;
  a.len = len;
  return a.str();
}
}  // namespace

Handshake::Handshake(Config cfg) : cfg_(std::move(cfg)) {
  conn_timeout_s_ = std::max(0.01, env::real("HARP_HANDSHAKE_TIMEOUT"));
  refused_s_ = std::max(0.0, env::real("HARP_HANDSHAKE_REFUSED_S"));
  max_pending_ = static_cast<size_t>(std::max<long long>(1, env::integer("HARP_HANDSHAKE_MAX_PENDING")));
  if (!cfg_.rank_name) cfg_.rank_name = [](int r) { return "rank " + std::to_string(r); };
}

Handshake::~Handshake() {
  for (auto* list : {&out_, &pending_})
    for (Conn* c : *list) {
      if (!c) continue;  // finished in the round that threw (run())
      if (c->fd >= 0) ::close(c->fd);
      delete c;
    }
  for (auto& [k, fd] : expected_)
    if (fd >= 0) ::close(fd);
  for (auto& [k, fd] : done_out_)
    if (fd >= 0) ::close(fd);
}

std::string Handshake::context(int connector, int acceptor, int index) const {
  char id[17];
  snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(cfg_.comm_id));
  return cfg_.transport + "|" + id + "|" + std::to_string(connector) + "|" + std::to_string(acceptor) + "|" +
         std::to_string(index);
}

void Handshake::dial(int peer, int index, const sockaddr_storage& addr, socklen_t len, std::string addr_text) {
  Conn* c = new Conn;
  c->outgoing = true;
  c->peer = peer;
  c->index = index;
  c->addr = addr;
  c->len = len;
  c->addr_text = std::move(addr_text);
  out_.push_back(c);
  startDial(*c);
}

void Handshake::expect(int peer, int index) { expected_[{peer, index}] = -1; }

int Handshake::take(int peer, int index) {
  for (auto* m : {&expected_, &done_out_}) {
    auto it = m->find({peer, index});
    if (it != m->end() && it->second >= 0) {
      int fd = it->second;
      it->second = -1;
      --untaken_;
      if (cfg_.keep_going) m->erase(it);  // lazy set-up: taken for good, a second hello is refused
      watch_.erase(std::remove_if(watch_.begin(), watch_.end(), [fd](auto& w) { return w.first == fd; }),
                   watch_.end());
      return fd;
    }
  }
  throw Error(Error::kSystem, cfg_.transport + " transport: no authenticated socket " + std::to_string(index) +
                                  " for " + cfg_.rank_name(peer));
}

// ---- connector ----------------------------------------------------------------
void Handshake::startDial(Conn& c) {
  c.buf.clear();
  c.state = 0;
  c.fd = ::socket(c.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (c.fd < 0) throw ErrnoError(cfg_.transport + " transport: socket()", errno);
  int rc;
  do rc = ::connect(c.fd, reinterpret_cast<const sockaddr*>(&c.addr), c.len);
  while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno == EINPROGRESS) return;  // POLLOUT will tell
  connected(c, rc == 0 ? 0 : errno);
}

// The connect of c finished with `err` (0 = connected): send the hello, or retry.
void Handshake::connected(Conn& c, int err) {
  if (err) {
    ::close(c.fd);
    c.fd = -1;
    if (err == ECONNREFUSED) {
      if (!c.refusing) c.refused_since = Clock::now();
      c.refusing = true;
      if (secondsSince(c.refused_since) >= refused_s_)
        throw Error(Error::kPeerFailure, cfg_.transport + " transport: " + cfg_.rank_name(c.peer) +
                                             " is not listening at " + c.addr_text + " (connection refused for " +
                                             std::to_string(static_cast<int>(refused_s_ + 0.5)) +
                                             " s): it exited or failed during set-up");
    } else {
      c.refusing = false;  // backlog full, unreachable for now...: keep trying until the deadline
    }
    c.state = 2;
    c.retry_at = Clock::now() + std::chrono::milliseconds(20);
    return;
  }
  c.refusing = false;
  if (cfg_.vet) {
    std::string why = cfg_.vet(c.fd);
    if (!why.empty())
      throw Error(Error::kSystem, cfg_.transport + " transport: the listener at " + c.addr_text + " for " +
                                      cfg_.rank_name(c.peer) + " is refused: " + why);
  }
  c.na = crypto::nonce();
  std::string hello = u32le(kMagic) + u32le(static_cast<uint32_t>(cfg_.rank)) + u64le(cfg_.comm_id) +
                      u32le(static_cast<uint32_t>(c.index)) + u32le(0) + c.na;
  if (!sendMsg(c.fd, hello)) return redial(c, "send of the hello failed");
  c.state = 1;
}

void Handshake::redial(Conn& c, const char* why) {
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
  c.state = 2;
  ++c.redials;
  if (c.redials == 10 || c.redials % 100 == 0)
    HARP_WARN("%s transport: connection to %s at %s keeps closing before its hello (%s); retrying",
              cfg_.transport.c_str(), cfg_.rank_name(c.peer).c_str(), c.addr_text.c_str(), why);
  c.retry_at = Clock::now() + std::chrono::milliseconds(std::min(200, 10 * c.redials));
}

bool Handshake::stepOutgoing(Conn& c) {
  if (c.state == 0) {  // connect finished (or failed)
    int err = 0;
    socklen_t l = sizeof err;
    if (getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
    connected(c, err);
    return true;
  }
  bool eof = false;
  if (!readInto(c, kChallengeBytes, &eof)) {
    if (eof) redial(c, "closed by the listener");
    return true;
  }
  std::string ctx = context(cfg_.rank, c.peer, c.index);
  c.nb = c.buf.substr(0, 32);
  if (!crypto::equal(c.buf.substr(32, 32), crypto::proof(cfg_.key, 'B', c.na, c.nb, ctx)))
    throw Error(Error::kSystem, cfg_.transport + " transport: the listener at " + c.addr_text + " did not prove it is " +
                                    cfg_.rank_name(c.peer) +
                                    " of this communicator (wrong token: a stale address or an impostor); "
                                    "nothing was sent to it");
  if (!sendMsg(c.fd, crypto::proof(cfg_.key, 'A', c.nb, c.na, ctx))) {
    redial(c, "send of the response failed");
    return true;
  }
  done_out_[{c.peer, c.index}] = c.fd;
  ++untaken_;
  if (!cfg_.keep_going) watch_.push_back({c.fd, c.peer});
  c.fd = -1;
  return false;
}

// ---- acceptor -----------------------------------------------------------------
bool Handshake::readInto(Conn& c, size_t want, bool* eof) {
  while (c.buf.size() < want) {
    char tmp[64];
    ssize_t r = ::recv(c.fd, tmp, std::min(sizeof tmp, want - c.buf.size()), MSG_DONTWAIT);
    if (r > 0) {
      c.buf.append(tmp, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    *eof = true;  // EOF or a reset
    return false;
  }
  return true;
}

void Handshake::refuse(Conn& c, const std::string& why) {
  logRefusal("refused a connection from " + c.addr_text + ": " + why);
  ::close(c.fd);
  c.fd = -1;
}

bool Handshake::stepIncoming(Conn& c) {
  bool eof = false;
  if (c.state == 0) {
    if (!readInto(c, kHelloBytes, &eof)) {
      if (eof) refuse(c, "closed before completing a hello");
      return !eof;
    }
    int peer = static_cast<int>(getU32(c.buf, 4));
    int index = static_cast<int>(getU32(c.buf, 16));
    if (getU32(c.buf, 0) != kMagic) return refuse(c, "not a HARP hello"), false;
    if (getU64(c.buf, 8) != cfg_.comm_id) return refuse(c, "hello for another communicator"), false;
    auto it = expected_.find({peer, index});
    if (getU32(c.buf, 20) != 0 || it == expected_.end() || it->second >= 0)
      return refuse(c, "hello claims rank " + std::to_string(getU32(c.buf, 4)) + " socket " +
                           std::to_string(getU32(c.buf, 16)) + ", which is not awaited"),
             false;
    c.peer = peer;
    c.index = index;
    c.na = c.buf.substr(24, 32);
    c.nb = crypto::nonce();
    c.buf.clear();
    if (!sendMsg(c.fd, c.nb + crypto::proof(cfg_.key, 'B', c.na, c.nb, context(peer, cfg_.rank, index))))
      return refuse(c, "send of the challenge failed"), false;
    c.state = 1;
  }
  if (!readInto(c, kResponseBytes, &eof)) {
    if (eof) refuse(c, "closed before answering the challenge (claimed " + cfg_.rank_name(c.peer) + ")");
    return !eof;
  }
  if (!crypto::equal(c.buf, crypto::proof(cfg_.key, 'A', c.nb, c.na, context(c.peer, cfg_.rank, c.index))))
    return refuse(c, "failed authentication as " + cfg_.rank_name(c.peer) +
                         " (wrong communicator token, or a replayed hello)"),
           false;
  int& slot = expected_[{c.peer, c.index}];
  if (slot >= 0) return refuse(c, "a second authenticated connection for the same socket"), false;
  slot = c.fd;
  ++untaken_;
  if (!cfg_.keep_going) watch_.push_back({c.fd, c.peer});
  c.fd = -1;
  return false;
}

// Only a connection whose hello has not been answered may be shed: once this
// end sent its challenge, the connector may already have answered it and count
// the connection as made (it would then see the close as its peer failing).
// False when every pending connection is past that point.
bool Handshake::shedOldestPending(const char* why) {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i]->state != 0) continue;
    Conn* c = pending_[i];
    pending_.erase(pending_.begin() + i);
    refuse(*c, std::string("dropped, ") + why);
    delete c;
    return true;
  }
  return false;
}

void Handshake::acceptNew(int listen_fd) {
  for (int k = 0; k < 64; ++k) {
    Conn c;
    c.len = sizeof c.addr;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&c.addr), &c.len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        logRefusal(std::string("accept failed (") + std::strerror(errno) + "); shedding pending connections");
        if (!shedOldestPending("out of file descriptors"))
          accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;  // EAGAIN, or an error poll will report again
    }
    c.fd = fd;
    c.addr_text = addrText(c.addr, c.len);
    if (cfg_.vet) {
      std::string why = cfg_.vet(fd);
      if (!why.empty()) {
        refuse(c, why);
        continue;
      }
    }
    if (pending_.size() >= max_pending_ && !shedOldestPending("too many unauthenticated connections pending")) {
      refuse(c, "too many connections in their handshake; the connector retries");
      continue;
    }
    c.started = Clock::now();
    pending_.push_back(new Conn(std::move(c)));
  }
}

// ---- the driver ------------------------------------------------------------------
void Handshake::logRefusal(const std::string& text) {
  ++refusals_;
  double now = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  if (now - log_window_start_ >= 1.0) {
    if (refusals_ - 1 > logged_)
      HARP_WARN("%s transport: %lld more refused connections not shown", cfg_.transport.c_str(),
                refusals_ - 1 - logged_);
    logged_ = refusals_ - 1;
    log_window_start_ = now;
    log_in_window_ = 0;
  }
  if (log_in_window_++ < 5) {
    ++logged_;
    HARP_WARN("%s transport (rank %d): %s", cfg_.transport.c_str(), cfg_.rank, text.c_str());
  }
}

void Handshake::timeout(Deadline) {
  std::string missing;
  for (auto& [k, fd] : expected_)
    if (fd < 0) missing += (missing.empty() ? "" : ", ") + cfg_.rank_name(k.first) + " to connect";
  for (Conn* c : out_)
    missing += (missing.empty() ? "" : ", ") + cfg_.rank_name(c->peer) + " to answer at " + c->addr_text;
  throw Error(Error::kTimeout, cfg_.transport + " transport: timed out waiting for " + missing);
}

void Handshake::run(int listen_fd, Deadline dl) {
  if (listen_fd >= 0) ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  for (;;) {
    bool awaiting = std::any_of(expected_.begin(), expected_.end(), [](auto& e) { return e.second < 0; });
    if (!awaiting && out_.empty()) break;
    if (dl.passed()) timeout(dl);
    turn(listen_fd, std::max(0, std::min(dl.remainingMs(), 50)), awaiting);
  }
}

void Handshake::step(int listen_fd) {
  bool awaiting = std::any_of(expected_.begin(), expected_.end(), [](auto& e) { return e.second < 0; });
  if (awaiting || !out_.empty() || !pending_.empty()) turn(listen_fd, 0, awaiting);
}

void Handshake::addPollFds(int listen_fd, std::vector<pollfd>& out) const {
  if (listen_fd >= 0 && Clock::now() >= accept_paused_until_) out.push_back({listen_fd, POLLIN, 0});
  for (const Conn* c : out_)
    if (c->state != 2) out.push_back({c->fd, short(c->state == 0 ? POLLOUT : POLLIN), 0});
  for (const Conn* c : pending_) out.push_back({c->fd, POLLIN, 0});
}

bool Handshake::busy() const { return !out_.empty() || !pending_.empty() || untaken_ > 0; }

bool Handshake::retryDue() const {
  for (const Conn* c : out_)
    if (c->state == 2) return true;
  return false;
}

std::vector<std::pair<int, int>> Handshake::ready() const {
  std::vector<std::pair<int, int>> r;
  for (auto* m : {&expected_, &done_out_})
    for (auto& [k, fd] : *m)
      if (fd >= 0) r.push_back(k);
  return r;
}

std::vector<std::pair<int, std::string>> Handshake::takeFailures() {
  std::vector<std::pair<int, std::string>> f;
  f.swap(failures_);
  return f;
}

// One round of the driver: retire stale pending connections, redial, poll(2)
// up to timeout_ms, step whatever is ready.
void Handshake::turn(int listen_fd, int timeout_ms, bool awaiting) {
  std::vector<pollfd> pfds;
  {
    // Pending connections past their own deadline, dials due again.
    for (size_t i = 0; i < pending_.size();) {
      if (secondsSince(pending_[i]->started) < conn_timeout_s_) { ++i; continue; }
      // Its answer may be waiting unread (a loaded host): read it before giving up.
      if (pending_[i]->state == 1 && !stepIncoming(*pending_[i])) {
        delete pending_[i];
        pending_.erase(pending_.begin() + i);
        continue;
      }
      refuse(*pending_[i], "no complete hello within " + std::to_string(conn_timeout_s_) + " s");
      delete pending_[i];
      pending_.erase(pending_.begin() + i);
    }
    for (Conn*& c : out_)
      if (c->state == 2 && Clock::now() >= c->retry_at) {
        try {
          startDial(*c);
        } catch (const Error& e) {
          if (!cfg_.keep_going) throw;
          failed(c, e.what());
        }
      }
    out_.erase(std::remove(out_.begin(), out_.end(), nullptr), out_.end());
    pfds.clear();
    bool listen_on = awaiting && listen_fd >= 0 && Clock::now() >= accept_paused_until_;
    pfds.push_back({listen_on ? listen_fd : -1, POLLIN, 0});
    for (Conn* c : out_) pfds.push_back({c->state == 2 ? -1 : c->fd, short(c->state == 0 ? POLLOUT : POLLIN), 0});
    for (Conn* c : pending_) pfds.push_back({c->fd, POLLIN, 0});
    for (auto& w : watch_) pfds.push_back({w.first, POLLIN, 0});
    int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) throw ErrnoError(cfg_.transport + " transport: poll", errno);
    if (rc <= 0) return;
    size_t at = 1;
    std::vector<Conn*> keep;
    // A finished Conn is freed and its slot nulled at once: when a later Conn
    // of the same round throws (a dead or impostor peer), ~Handshake must not
    // free or close it a second time (a double free, and a stray close
    // of whatever reused the fd number, after a peer died during set-up).
    for (Conn*& c : out_) {
      bool ready = pfds[at++].revents != 0;
      bool more = true;
      try {
        more = !ready || stepOutgoing(*c);
      } catch (const Error& e) {
        if (!cfg_.keep_going) throw;
        failed(c, e.what());
        continue;
      }
      if (more) keep.push_back(c);
      else delete c, c = nullptr;
    }
    out_.swap(keep);
    keep.clear();
    for (Conn*& c : pending_) {
      bool ready = pfds[at++].revents != 0;
      if (!ready || stepIncoming(*c)) keep.push_back(c);
      else delete c, c = nullptr;
    }
    pending_.swap(keep);
    std::vector<std::pair<int, int>> still;
    for (auto& w : watch_) {
      short ev = pfds[at++].revents;
      if (!ev) { still.push_back(w); continue; }
      char b;
      ssize_t k = ::recv(w.first, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
        throw Error(Error::kPeerFailure, cfg_.transport + " transport: " + cfg_.rank_name(w.second) +
                                             " closed its connection during set-up (it exited or failed)");
      if (k < 0) still.push_back(w);  // spurious; data (k > 0) means it is alive and talking: stop watching
    }
    watch_.swap(still);
    if (pfds[0].revents) acceptNew(listen_fd);
  }
}

// keep_going: a dial that failed for good is reported (takeFailures), not thrown.
void Handshake::failed(Conn*& c, const std::string& why) {
  failures_.push_back({c->peer, why});
  if (c->fd >= 0) ::close(c->fd);
  delete c;
  c = nullptr;
}

}  // namespace harp::transport
