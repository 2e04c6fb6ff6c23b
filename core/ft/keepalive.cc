// core/ft/keepalive.cc — the heartbeat thread of core/ft/keepalive.h.
#include "core/ft/keepalive.h"

#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "bootstrap/crypto.h"
#include "base/env.h"
#include "base/log.h"
#include "bootstrap/socket.h"
#include "base/types.h"

namespace harp {
namespace {

constexpr char kMagic[4] = {'H', 'K', 'A', '2'};
// kDead: bytes 5-7 hold the dead rank; kProbe, kAnswer: the rank probed / the
// prober answered (24 bits), bytes 24-31 the prober's nonce.
constexpr uint8_t kBeat = 1, kBye = 2, kDead = 3, kProbe = 4, kAnswer = 5;
constexpr int kMaxNoticeRank = (1 << 24) - 1;
constexpr size_t kSigned = 32, kMacBytes = 16, kPacket = kSigned + kMacBytes;
// An ICMP refusal is only a hint (ICMP is not authenticated): the peer is
// probed kProbes times, confirm_s_ / kProbes apart, and declared gone only when
// no signed answer came confirm_s_ (HARP_KEEPALIVE_CONFIRM) after the first
// probe. A live peer answers within a round trip and a scheduling delay
// (measured: at most 4 ms on loopback with 2 cores under load 10).
constexpr int kProbes = 5;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string mac(const std::string& key, const char* p) {
  return crypto::hmacSha256(key, std::string(p, kSigned)).substr(0, kMacBytes);
}

// Same address and port (the ICMP error names the destination we sent to).
bool sameEndpoint(const sockaddr_storage& a, const SockAddr& b) {
  if (a.ss_family != b.family()) return false;
  if (a.ss_family == AF_INET) {
    auto* x = reinterpret_cast<const sockaddr_in*>(&a);
    auto* y = reinterpret_cast<const sockaddr_in*>(&b.ss);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  auto* x = reinterpret_cast<const sockaddr_in6*>(&a);
  auto* y = reinterpret_cast<const sockaddr_in6*>(&b.ss);
  return x->sin6_port == y->sin6_port && std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
}

}  // namespace

struct KeepAlive::Peer {
  SockAddr addr;
  double last = 0;        // when its latest beat arrived (start time before the first)
  uint32_t last_seq = 0;  // newest sequence accepted
  bool gone = false;      // said bye: left cleanly, never reported
  bool refused = false;   // its process is gone: a refusal no probe answer contradicted (here, or at told_by)
  double suspect_until = 0;  // > 0: an ICMP refusal awaits confirmation until then (no answer: refused)
  double next_probe = 0;     // while suspect: when the next probe goes out
  int probes = 0;            // probes sent in this confirmation
  uint64_t nonce = 0;        // this confirmation's nonce, echoed by a signed answer
  int told_by = -1;       // the rank whose kDead notice said so (-1: found here)
  bool failed = false;    // reported
};

KeepAlive::KeepAlive(int rank, int size, uint64_t comm_id, const std::string& secret, double interval_s,
                     double timeout_s, const std::string& bind_host)
    : rank_(rank), size_(size), comm_id_(comm_id), key_(crypto::deriveKey(secret, "keepalive")),
      interval_s_(interval_s), timeout_s_(timeout_s), confirm_s_(env::timeout("HARP_KEEPALIVE_CONFIRM")) {
  SockAddr a = SockAddr::parse(bind_host, 0);
  fd_ = ::socket(a.family(), SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) throw ErrnoError("keep-alive socket", errno);
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&a.ss), a.len) != 0) {
    int e = errno;
    ::close(fd_);
    throw ErrnoError("keep-alive bind to " + a.str(), e);
  }
  // ICMP errors (a dead peer's closed port) onto the error queue: receiveErrors().
  int on = 1;
  if (a.family() == AF_INET6) ::setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVERR, &on, sizeof on);
  else ::setsockopt(fd_, IPPROTO_IP, IP_RECVERR, &on, sizeof on);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    int e = errno;
    ::close(fd_);
    throw ErrnoError("keep-alive eventfd", e);
  }
}

KeepAlive::~KeepAlive() { stop(); }

std::string KeepAlive::localAddress() const { return localAddrOf(fd_).str(); }

std::vector<int> KeepAlive::watched() const {
  std::vector<int> w;
  if (size_ <= kAllToAllRanks) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) w.push_back(r);
    return w;
  }
  for (int d : {-2, -1, 1, 2}) w.push_back(((rank_ + d) % size_ + size_) % size_);
  std::sort(w.begin(), w.end());
  w.erase(std::unique(w.begin(), w.end()), w.end());
  return w;
}

void KeepAlive::start(const std::vector<std::string>& addrs, std::function<std::string(int)> describe,
                      OnFailure cb) {
  if (static_cast<int>(addrs.size()) != size_) throw Error(Error::kInternal, "keep-alive: wrong address count");
  peers_.resize(size_);
  const double t = now();
  watch_.clear();
  for (int r : watched())
    if (!addrs[r].empty()) watch_.push_back(r);  // "": that rank runs no keep-alive
  for (int r : watch_) {
    peers_[r].addr = SockAddr::parse(addrs[r], 0);
    peers_[r].last = t;
  }
  describe_ = std::move(describe);
  cb_ = std::move(cb);
  thread_ = std::thread([this] {
    env::nameThread("harp-keepalive");
    loop();
  });
}

void KeepAlive::stop() {
  std::lock_guard<std::mutex> g(stop_mu_);  // against a concurrent probeNow() writing to wake_fd_
  if (thread_.joinable()) {
    stop_.store(true);
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_, &one, 8);
    (void)n;
    thread_.join();
    beat(kBye);
  }
  if (fd_ >= 0) ::close(fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  fd_ = wake_fd_ = -1;
}

void KeepAlive::probeNow() {
  std::lock_guard<std::mutex> g(stop_mu_);
  if (wake_fd_ < 0 || stop_.load()) return;
  probe_.store(true);
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, 8);
  (void)n;
}

std::vector<int> KeepAlive::failed() const {
  std::lock_guard<std::mutex> g(mu_);
  return failed_;
}

// A signed packet of `kind` from this rank: `arg` in bytes 5-7 (24 bits), `nonce` in 24-31.
void KeepAlive::packet(char* p, uint8_t kind, int arg, uint64_t nonce) {
  std::memset(p, 0, kPacket);
  std::memcpy(p, kMagic, 4);
  p[4] = static_cast<char>(kind);
  for (int i = 0; i < 3; ++i) p[5 + i] = static_cast<char>((arg >> (8 * i)) & 0xff);
  std::memcpy(p + 8, &comm_id_, 8);
  int32_t r = rank_;
  std::memcpy(p + 16, &r, 4);
  uint32_t s = ++seq_;
  std::memcpy(p + 20, &s, 4);
  std::memcpy(p + 24, &nonce, 8);
  std::memcpy(p + kSigned, mac(key_, p).data(), kMacBytes);
}

// Best effort: a full socket buffer or an unreachable peer only loses this packet.
void KeepAlive::sendTo(int q, const char* p) {
  const Peer& peer = peers_[q];
  // With IP_RECVERR an ICMP error for an earlier packet is also left pending on
  // the socket, and the next sendto (to any peer) reports it once and sends
  // nothing: without the retry, a peer that closed its port would silence our
  // beats to the next peer in the list, which then reports us dead.
  for (int attempt = 0; attempt < 3; ++attempt) {
    ssize_t n = ::sendto(fd_, p, kPacket, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&peer.addr.ss),
                         peer.addr.len);
    if (n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) break;
  }
}

// One packet to every watched peer.
void KeepAlive::beat(uint8_t kind, int dead) {
  if (fd_ < 0) return;
  char p[kPacket];
  packet(p, kind, kind == kDead ? dead : 0, 0);
  for (int q : watch_) {
    const Peer& peer = peers_[q];
    if (peer.gone || peer.refused) continue;  // left, or its process is gone: every beat would draw an ICMP error
    sendTo(q, p);
  }
}

// Suspects due for a (re)probe: a signed probe with the confirmation's nonce.
void KeepAlive::probeSuspects(double t) {
  for (int q : watch_) {
    Peer& peer = peers_[q];
    if (peer.suspect_until <= 0 || peer.probes >= kProbes || t < peer.next_probe) continue;
    char p[kPacket];
    packet(p, kProbe, q, peer.nonce);
    sendTo(q, p);
    ++peer.probes;
    peer.next_probe = t + confirm_s_ / kProbes;
  }
}

// Drain the socket; a packet counts only when it is exactly one heartbeat of
// this communicator, from a watched rank, signed, and newer than the last.
void KeepAlive::receive(double t) {
  char p[kPacket + 1];
  for (int errors = 0;;) {
    ssize_t n = ::recv(fd_, p, sizeof p, MSG_DONTWAIT);
    // Any error but "nothing left" is a pending ICMP error reported once (and
    // cleared): the packets behind it are still to be read.
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || ++errors > 64)) return;
    if (n < 0) continue;
    if (n != static_cast<ssize_t>(kPacket) || std::memcmp(p, kMagic, 4) != 0) continue;
    uint64_t id;
    int32_t r;
    uint32_t s;
    std::memcpy(&id, p + 8, 8);
    std::memcpy(&r, p + 16, 4);
    std::memcpy(&s, p + 20, 4);
    if (id != comm_id_ || r < 0 || r >= size_ || r == rank_ || peers_[r].addr.len == 0) continue;
    if (!crypto::equal(mac(key_, p), std::string(p + kSigned, kMacBytes))) continue;
    Peer& peer = peers_[r];
    if (s <= peer.last_seq) continue;
    peer.last_seq = s;
    peer.last = t;
    const int arg = (p[5] & 0xff) | (p[6] & 0xff) << 8 | (p[7] & 0xff) << 16;
    uint64_t nonce;
    std::memcpy(&nonce, p + 24, 8);
    if (p[4] == kBye) peer.gone = true;
    if (p[4] == kDead) told(r, arg);
    if (p[4] == kProbe && arg == rank_) {  // alive: say so, with the prober's nonce
      char a[kPacket];
      packet(a, kAnswer, r, nonce);
      sendTo(r, a);
    }
    // The answer to this confirmation's probes: the peer is alive after all.
    if (p[4] == kAnswer && arg == rank_ && peer.suspect_until > 0 && nonce == peer.nonce) {
      HARP_INFO("keep-alive: %s answered a signed probe %.1f ms after an ICMP port unreachable: alive (the "
                "ICMP error was forged or stale)", describe_(r).c_str(), (t - (peer.suspect_until - confirm_s_)) * 1e3);
      peer.suspect_until = 0;
    }
  }
}

// A signed notice from watched rank `from`: rank `dead`'s port refused its
// beats. Spreads the first ICMP verdict to every rank at once (the kernel
// rate-limits ICMP per host, so the others' own beats may get no answer).
void KeepAlive::told(int from, int dead) {
  if (dead >= size_ || dead == rank_ || peers_[dead].addr.len == 0) return;
  Peer& d = peers_[dead];
  if (d.gone || d.failed || d.refused) return;
  d.refused = true;  // the sender confirmed it (no answer to its probes): trusted, it is signed
  d.suspect_until = 0;
  d.told_by = from;
}

// The error queue: ICMP "port unreachable" for a packet to a watched peer
// suggests its process (and so its socket) is gone; anyone can forge one, so
// it starts a confirmation (probeSuspects, detect). Read after the packets, so
// a bye that came before the close is seen first.
void KeepAlive::receiveErrors(double t) {
  for (;;) {
    char data[kPacket], ctl[512];
    sockaddr_storage to{};
    iovec iov{data, sizeof data};
    msghdr m{};
    m.msg_name = &to;
    m.msg_namelen = sizeof to;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (::recvmsg(fd_, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) return;
    bool refused = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      const bool v4 = c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR;
      const bool v6 = c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_RECVERR;
      if (!v4 && !v6) continue;
      sock_extended_err e;
      std::memcpy(&e, CMSG_DATA(c), sizeof e);
      refused |= e.ee_errno == ECONNREFUSED &&
                 (e.ee_origin == SO_EE_ORIGIN_ICMP || e.ee_origin == SO_EE_ORIGIN_ICMP6);
    }
    if (!refused || m.msg_namelen == 0) continue;
    for (int r : watch_) {
      Peer& p = peers_[r];
      if (!sameEndpoint(to, p.addr) || p.gone || p.failed || p.refused || p.suspect_until > 0) continue;
      std::string n = crypto::nonce();
      std::memcpy(&p.nonce, n.data(), sizeof p.nonce);
      p.suspect_until = t + confirm_s_;
      p.next_probe = t;
      p.probes = 0;
    }
  }
}

void KeepAlive::detect(double t) {
  for (int r : watch_) {  // a refusal no probe answer contradicted: the process is gone
    Peer& p = peers_[r];
    if (p.suspect_until > 0 && t >= p.suspect_until) p.refused = true, p.suspect_until = 0;
  }
  // A host or link failure silences several ranks about together: while one
  // peer is past the timeout and another is within an interval of it, wait
  // (at most one interval) so one report names them all.
  bool due = false, soon = false;
  double first_due = t;
  for (int r : watch_) {
    const Peer& p = peers_[r];
    if (p.gone || p.failed || p.refused) continue;
    if (t - p.last > timeout_s_) due = true, first_due = std::min(first_due, p.last + timeout_s_);
    else if (t - p.last > timeout_s_ - interval_s_) soon = true;
  }
  const bool defer = due && soon && t - first_due < interval_s_;
  defer_until_ = defer ? first_due + interval_s_ : 0;
  std::vector<int> now_failed;
  bool closed = false;
  int told_by = -1;
  for (int r : watch_) {
    Peer& p = peers_[r];
    if (p.gone || p.failed || (!p.refused && (defer || t - p.last <= timeout_s_))) continue;
    p.failed = true;
    closed |= p.refused;
    if (p.told_by >= 0) told_by = p.told_by;
    now_failed.push_back(r);
  }
  if (now_failed.empty()) return;
  for (int r : now_failed)
    if (peers_[r].refused && r <= kMaxNoticeRank) beat(kDead, r);  // tell the others (kDead notice)
  std::string who;
  for (int r : now_failed) who += (who.empty() ? "" : ", ") + describe_(r);
  {
    std::lock_guard<std::mutex> g(mu_);
    failed_.insert(failed_.end(), now_failed.begin(), now_failed.end());
    std::sort(failed_.begin(), failed_.end());
  }
  std::string why = who + (now_failed.size() == 1 ? " is" : " are") + " dead or unreachable: " +
                    (closed ? std::string("its keep-alive port is closed and it answers no signed probe (the process is gone") +
                                  (told_by >= 0 ? ", seen by rank " + std::to_string(told_by) : "") + ")"
                            : "no keep-alive for " + formatSeconds(timeout_s_) + " s (HARP_KEEPALIVE_TIMEOUT)");
  HARP_WARN("%s", why.c_str());
  if (cb_) cb_(now_failed, why);
}

void KeepAlive::loop() {
  double next = now();
  while (!stop_.load()) {
    double t = now();
    if (t >= next || probe_.exchange(false)) {
      beat(kBeat);
      if (on_beat_) on_beat_();
      next = t + interval_s_;
    }
    probeSuspects(t);
    detect(t);
    pollfd pfds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // Wake for the next beat or the first watched peer's deadline, whichever
    // comes first: a silent peer is reported at the timeout, not up to an interval later.
    double wake = next;
    for (int r : watch_)
      if (!peers_[r].gone && !peers_[r].failed && peers_[r].last + timeout_s_ >= t)
        wake = std::min(wake, peers_[r].last + timeout_s_ + 0.001);
    for (int r : watch_)
      if (peers_[r].suspect_until > 0)
        wake = std::min({wake, peers_[r].suspect_until + 0.001,
                         peers_[r].probes < kProbes ? peers_[r].next_probe : wake});
    if (defer_until_ > 0) wake = std::min(wake, defer_until_ + 0.001);
    int ms = static_cast<int>(std::max(1.0, (wake - now()) * 1000.0));
    int n = ::poll(pfds, 2, ms);
    if (n > 0 && pfds[1].revents) {
      uint64_t v;
      ssize_t r = ::read(wake_fd_, &v, 8);
      (void)r;
    }
    if (n > 0 && pfds[0].revents) {
      const double t2 = now();
      receive(t2);
      receiveErrors(t2);  // POLLERR: an ICMP error is queued
    }
  }
}

}  // namespace harp
