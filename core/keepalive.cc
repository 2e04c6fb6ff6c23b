// core/keepalive.cc — the heartbeat thread of core/keepalive.h.
#include "core/keepalive.h"

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

#include "core/base/crypto.h"
#include "core/base/env.h"
#include "core/base/log.h"
#include "core/base/socket.h"
#include "core/base/types.h"

namespace harp {
namespace {

constexpr char kMagic[4] = {'H', 'K', 'A', '1'};
constexpr uint8_t kBeat = 1, kBye = 2, kDead = 3;  // kDead: bytes 5-7 hold a dead rank (24 bits)
constexpr int kMaxNoticeRank = (1 << 24) - 1;
constexpr size_t kSigned = 24, kMacBytes = 16, kPacket = kSigned + kMacBytes;

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
  bool refused = false;   // ICMP port unreachable (here, or at the rank told_by): its process is gone
  int told_by = -1;       // the rank whose kDead notice said so (-1: found here)
  bool failed = false;    // reported
};

KeepAlive::KeepAlive(int rank, int size, uint64_t comm_id, const std::string& secret, double interval_s,
                     double timeout_s, const std::string& bind_host)
    : rank_(rank), size_(size), comm_id_(comm_id), key_(crypto::deriveKey(secret, "keepalive")),
      interval_s_(interval_s), timeout_s_(timeout_s) {
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

// One packet to every watched peer (best effort: a full socket buffer or an
// unreachable peer only loses this beat).
void KeepAlive::beat(uint8_t kind, int dead) {
  if (fd_ < 0) return;
  char p[kPacket] = {};
  std::memcpy(p, kMagic, 4);
  p[4] = static_cast<char>(kind);
  if (kind == kDead)
    for (int i = 0; i < 3; ++i) p[5 + i] = static_cast<char>((dead >> (8 * i)) & 0xff);
  std::memcpy(p + 8, &comm_id_, 8);
  int32_t r = rank_;
  std::memcpy(p + 16, &r, 4);
  uint32_t s = ++seq_;
  std::memcpy(p + 20, &s, 4);
  std::memcpy(p + kSigned, mac(key_, p).data(), kMacBytes);
  for (int q : watch_) {
    const Peer& peer = peers_[q];
    if (peer.gone || peer.refused) continue;  // left, or its process is gone: every beat would draw an ICMP error
    // With IP_RECVERR an ICMP error for an earlier beat is also left pending on
    // the socket, and the next sendto (to any peer) reports it once and sends
    // nothing: without the retry, a peer that closed its port would silence our
    // beats to the next peer in the list, which then reports us dead.
    for (int attempt = 0; attempt < 3; ++attempt) {
      ssize_t n = ::sendto(fd_, p, kPacket, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&peer.addr.ss),
                           peer.addr.len);
      if (n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) break;
    }
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
    if (p[4] == kBye) peer.gone = true;
    if (p[4] == kDead) told(r, (p[5] & 0xff) | (p[6] & 0xff) << 8 | (p[7] & 0xff) << 16);
  }
}

// A signed notice from watched rank `from`: rank `dead`'s port refused its
// beats. Spreads the first ICMP verdict to every rank at once (the kernel
// rate-limits ICMP per host, so the others' own beats may get no answer).
void KeepAlive::told(int from, int dead) {
  if (dead >= size_ || dead == rank_ || peers_[dead].addr.len == 0) return;
  Peer& d = peers_[dead];
  if (d.gone || d.failed || d.refused) return;
  d.refused = true;
  d.told_by = from;
}

// The error queue: ICMP "port unreachable" for a beat to a watched peer means
// its process (and so its socket) is gone. Read after the packets, so a bye
// that came before the close is seen first.
void KeepAlive::receiveErrors() {
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
    for (int r : watch_)
      if (sameEndpoint(to, peers_[r].addr)) peers_[r].refused = true;
  }
}

void KeepAlive::detect(double t) {
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
                    (closed ? std::string("its keep-alive port is closed (the process is gone") +
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
      next = t + interval_s_;
    }
    detect(t);
    pollfd pfds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // Wake for the next beat or the first watched peer's deadline, whichever
    // comes first: a silent peer is reported at the timeout, not up to an interval later.
    double wake = next;
    for (int r : watch_)
      if (!peers_[r].gone && !peers_[r].failed && peers_[r].last + timeout_s_ >= t)
        wake = std::min(wake, peers_[r].last + timeout_s_ + 0.001);
    if (defer_until_ > 0) wake = std::min(wake, defer_until_ + 0.001);
    int ms = static_cast<int>(std::max(1.0, (wake - now()) * 1000.0));
    int n = ::poll(pfds, 2, ms);
    if (n > 0 && pfds[1].revents) {
      uint64_t v;
      ssize_t r = ::read(wake_fd_, &v, 8);
      (void)r;
    }
    if (n > 0 && pfds[0].revents) {
      receive(now());
      receiveErrors();  // POLLERR: an ICMP error is queued
    }
  }
}

}  // namespace harp
