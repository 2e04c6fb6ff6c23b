// transport/tcp/tcp.cc — HARP's TCP transport (kernel sockets).
//
// Per peer pair: HARP_NSOCKS_PERPEER sockets (default 1). Every message is a
// 24-byte frame header {kind, tag, len} on socket 0, then the payload. Messages
// of at least HARP_SOCKET_STRIPE_MIN bytes (default 1M) are striped: chunk k
// (HARP_SOCKET_CHUNK bytes, default 512K) travels on socket k % nsocks, so
// several sockets (and, on real NICs, several flows/queues) carry one message.
// Both sides derive the same chunking from the posted length; the header
// check on socket 0 catches disagreements.
//
// One thread drives everything: progress() tries non-blocking send/recv on
// sockets with queued work; wait() poll(2)s every socket (POLLIN on idle
// sockets too, so abort notices and EOF from any peer are seen at once) plus an
// eventfd for cross-thread abort. No busy loops: the core spins briefly, then
// calls wait(), which blocks in the kernel.
//
// Connection setup: lower rank accepts, higher rank connects; each connection
// opens with the mutual challenge-response of transport/handshake.h (context
// "tcp|<comm id>|<connector>|<acceptor>|<socket index>"), run for all sockets
// at once. A connection that fails it is refused and logged; nothing else is
// ever read from it.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "core/base/env.h"
#include "core/base/log.h"
#include "core/base/socket.h"
#include "transport/handshake.h"
#include "transport/transport.h"

namespace harp::transport {
namespace {

enum FrameKind : uint32_t { kData = 0x48500001, kAbort = 0x48500002, kBye = 0x48500003 };
struct FrameHeader {
  uint32_t kind;
  uint32_t reserved;
  uint64_t tag;
  uint64_t len;
};
static_assert(sizeof(FrameHeader) == 24);

// A contiguous piece of one message on one socket.
struct Segment {
  Request* req;
  bool header;        // send: prepend a frame header; recv: expect and check it
  FrameHeader hdr;    // send: the header to write
  size_t hdr_done;    // bytes of header written/read
  char* data;
  size_t len;
  size_t done;
};

struct Sock {
  int fd = -1;
  std::deque<Segment> sendq, recvq;
  // Socket 0 only: a header read while no receive was posted.
  FrameHeader pending{};
  size_t pending_have = 0;
};

class TcpTransport;

class TcpPair : public Pair {
 public:
  TcpPair(TcpTransport* t, int peer, int nsocks) : t_(t), peer_(peer), socks_(nsocks) {}
  ~TcpPair() override {
    for (auto& s : socks_)
      if (s.fd >= 0) ::close(s.fd);
  }
  void isend(Request* r) override;
  void irecv(Request* r) override;

  bool progress();
  void failAll(Request::Failure f, const std::string& why);
  void sendControl(FrameKind kind, const std::string& text);
  void handleIdle();  // socket 0 readable with no receive posted
  bool busy() const {
    for (auto& s : socks_)
      if (!s.sendq.empty() || !s.recvq.empty()) return true;
    return false;
  }

  TcpTransport* t_;
  int peer_;
  std::vector<Sock> socks_;
  bool failed_ = false;
  std::string fail_reason_;
  bool peer_closed_ = false;  // peer said goodbye
  bool peer_gone_ = false;    // connection lost (EOF, reset) or peer aborted: no notice to send
  std::string abort_text_;    // the peer's abort notice, once read

 private:
  bool progressSend(Sock& s);
  bool progressRecv(Sock& s, int index);
  void finishSegment(Request* r);
  void peerGone(const std::string& how);
  void localFault(Request* r, bool sending);
  std::string who() const;
};

class TcpTransport : public Transport {
 public:
  TcpTransport(const CommInfo& info, const std::vector<PeerInfo>& peers);
  ~TcpTransport() override;
  const char* name() const override { return "tcp"; }
  std::string localAddress(int) override { return listen_addr_.str(); }
  void connect(const std::vector<int>& peers, const std::vector<std::string>& remote) override;
  Pair* pair(int peer) override {
    auto it = pairs_.find(peer);
    return it == pairs_.end() ? nullptr : it->second.get();
  }
  bool progress() override;
  void wait(int timeout_ms) override;
  void abort(const std::string& why) override;
  std::string abortNotice() override;

  CommInfo info_;
  std::vector<PeerInfo> peer_info_;
  int nsocks_;
  size_t stripe_min_, chunk_;
  std::string rankName(int r) const {
    std::string s = "rank " + std::to_string(r);
    if (r >= 0 && r < (int)peer_info_.size() && !peer_info_[r].hostname.empty())
      s += " (" + peer_info_[r].hostname + " pid " + std::to_string(peer_info_[r].pid) + ")";
    return s;
  }

 private:
  void doAbort();
  int listen_fd_ = -1;
  SockAddr listen_addr_;
  int wake_fd_ = -1;
  std::map<int, std::unique_ptr<TcpPair>> pairs_;
  std::mutex abort_mu_;
  std::atomic<bool> abort_requested_{false};
  bool aborted_ = false;
  std::string abort_reason_;
  std::mutex drive_mu_;
};

// ---------------------------------------------------------------------------
std::string TcpPair::who() const { return t_->rankName(peer_); }

void TcpPair::isend(Request* r) {
  r->peer = peer_;
  if (failed_) return r->fail(Request::kPeerFailure, fail_reason_);
  if (peer_closed_) return r->fail(Request::kPeerFailure, who() + " has already closed its communicator");
  int n = static_cast<int>(socks_.size());
  char* data = static_cast<char*>(r->buf);
  FrameHeader h{kData, 0, r->tag, r->len};
  if (n == 1 || r->len < t_->stripe_min_) {
    r->tp_word = 1;
    socks_[0].sendq.push_back({r, true, h, 0, data, r->len, 0});
    return;
  }
  size_t chunks = (r->len + t_->chunk_ - 1) / t_->chunk_;
  r->tp_word = chunks;
  for (size_t k = 0; k < chunks; ++k) {
    size_t off = k * t_->chunk_, len = std::min(t_->chunk_, r->len - off);
    socks_[k % n].sendq.push_back({r, k == 0, h, 0, data + off, len, 0});
  }
}

void TcpPair::irecv(Request* r) {
  r->peer = peer_;
  if (failed_) return r->fail(Request::kPeerFailure, fail_reason_);
  if (peer_closed_) return r->fail(Request::kPeerFailure, who() + " has already closed its communicator");
  int n = static_cast<int>(socks_.size());
  char* data = static_cast<char*>(r->buf);
  if (n == 1 || r->len < t_->stripe_min_) {
    r->tp_word = 1;
    socks_[0].recvq.push_back({r, true, {}, 0, data, r->len, 0});
    return;
  }
  size_t chunks = (r->len + t_->chunk_ - 1) / t_->chunk_;
  r->tp_word = chunks;
  for (size_t k = 0; k < chunks; ++k) {
    size_t off = k * t_->chunk_, len = std::min(t_->chunk_, r->len - off);
    socks_[k % n].recvq.push_back({r, k == 0, {}, 0, data + off, len, 0});
  }
}

void TcpPair::finishSegment(Request* r) {
  if (r->state != Request::kPending) return;
  if (--r->tp_word == 0) r->complete();
}

void TcpPair::failAll(Request::Failure f, const std::string& why) {
  if (!failed_) {
    failed_ = true;
    fail_reason_ = why;
  }
  for (auto& s : socks_) {
    for (auto& seg : s.sendq)
      if (!seg.req->done()) seg.req->fail(f, why);
    for (auto& seg : s.recvq)
      if (!seg.req->done()) seg.req->fail(f, why);
    s.sendq.clear();
    s.recvq.clear();
  }
}

// The kernel could not read (send) or write (receive) our own buffer: the
// caller's fault, not the peer's. The stream is out of step afterwards.
void TcpPair::localFault(Request* r, bool sending) {
  char where[64];
  snprintf(where, sizeof where, "%zu bytes at %p", r->len, r->buf);
  r->fail(Request::kLocal, std::string("bad local ") + (sending ? "send" : "receive") + " buffer on rank " +
                               std::to_string(t_->info_.rank) + ": " + where + " is not " +
                               (sending ? "readable" : "writable") + " memory of this process (EFAULT)");
  failAll(Request::kLocal, "connection to " + who() + " abandoned after a bad local buffer on rank " +
                               std::to_string(t_->info_.rank) + " (EFAULT)");
}

void TcpPair::peerGone(const std::string& how) {
  peer_gone_ = true;
  if (failed_) return;
  std::string why = peer_closed_ ? who() + " has closed its communicator"
                                 : who() + " " + how + " (the process died or closed its communicator mid-collective)";
  failAll(Request::kPeerFailure, why);
}

bool TcpPair::progressSend(Sock& s) {
  bool moved = false;
  while (!s.sendq.empty()) {
    Segment& g = s.sendq.front();
    if (g.req->done()) {  // failed elsewhere (e.g. mismatch on another socket)
      s.sendq.pop_front();
      continue;
    }
    iovec iov[2];
    int cnt = 0;
    size_t hdr_len = g.header ? sizeof(FrameHeader) : 0;
    if (g.hdr_done < hdr_len) iov[cnt++] = {reinterpret_cast<char*>(&g.hdr) + g.hdr_done, hdr_len - g.hdr_done};
    if (g.done < g.len) iov[cnt++] = {g.data + g.done, g.len - g.done};
    if (cnt > 0) {
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = cnt;
      ssize_t w = ::sendmsg(s.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return moved;
        if (errno == EFAULT) return localFault(g.req, true), true;
        peerGone(std::string("reset the connection (") + std::strerror(errno) + ")");
        return true;
      }
      moved = true;
      size_t wh = std::min<size_t>(w, hdr_len - g.hdr_done);
      g.hdr_done += wh;
      g.done += w - wh;
      if (g.hdr_done < hdr_len || g.done < g.len) return moved;  // socket buffer full
    }
    Request* r = g.req;
    s.sendq.pop_front();
    finishSegment(r);
    moved = true;
  }
  return moved;
}

bool TcpPair::progressRecv(Sock& s, int index) {
  bool moved = false;
  while (!s.recvq.empty()) {
    Segment& g = s.recvq.front();
    if (g.req->done()) {
      s.recvq.pop_front();
      continue;
    }
    if (g.header && g.hdr_done < sizeof(FrameHeader)) {
      // Use a header read earlier while nothing was posted, if any.
      if (index == 0 && s.pending_have > 0) {
        size_t take = std::min(s.pending_have, sizeof(FrameHeader));
        std::memcpy(&g.hdr, &s.pending, take);
        g.hdr_done = take;
        s.pending_have = 0;
      }
      if (g.hdr_done < sizeof(FrameHeader)) {
        // Read the rest of the header and, optimistically, the payload in one call.
        iovec iov[2] = {{reinterpret_cast<char*>(&g.hdr) + g.hdr_done, sizeof(FrameHeader) - g.hdr_done},
                        {g.data, g.len}};
        ssize_t r = ::readv(s.fd, iov, g.len ? 2 : 1);
        if (r == 0) { peerGone("closed the connection"); return true; }
        if (r < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return moved;
          if (errno == EFAULT) return localFault(g.req, false), true;
          peerGone(std::string("reset the connection (") + std::strerror(errno) + ")");
          return true;
        }
        moved = true;
        size_t h = std::min<size_t>(r, sizeof(FrameHeader) - g.hdr_done);
        g.hdr_done += h;
        g.done += r - h;
        if (g.hdr_done < sizeof(FrameHeader)) return moved;
      }
      // Header complete: check it.
      if (g.hdr.kind == kAbort || g.hdr.kind == kBye) {
        // Control frame in place of data. Its body (abort text) may have been
        // read into g.data already; collect it.
        std::string text(g.data, std::min<size_t>(g.done, g.hdr.len));
        size_t rest = g.hdr.len > text.size() ? g.hdr.len - text.size() : 0;
        if (rest) {
          std::string more(rest, '\0');
          try {
            recvAll(s.fd, more.data(), rest, Deadline::after(2), who());
            text += more;
          } catch (const Error&) {
          }
        }
        if (g.hdr.kind == kBye) {
          peer_closed_ = true;
          peerGone("");
        } else {
          peer_gone_ = true;
          abort_text_ = who() + " aborted the communicator: " + text;
          failAll(Request::kPeerFailure, who() + " aborted the communicator: " + text);
        }
        return true;
      }
      if (g.hdr.kind != kData) {
        failAll(Request::kPeerFailure, "corrupt frame from " + who() + " (bad magic)");
        return true;
      }
      if (g.hdr.tag != g.req->tag || g.hdr.len != g.req->len) {
        Request* r = g.req;
        r->peer_tag = g.hdr.tag;
        r->peer_len = g.hdr.len;
        r->fail(Request::kMismatch, "message from " + who() + " does not match the posted receive");
        // The byte stream is no longer in step; nothing more can be received.
        failAll(Request::kPeerFailure, "stream from " + who() + " out of step after a collective mismatch");
        return true;
      }
    }
    if (g.done < g.len) {
      ssize_t r = ::recv(s.fd, g.data + g.done, g.len - g.done, MSG_DONTWAIT);
      if (r == 0) { peerGone("closed the connection"); return true; }
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return moved;
        if (errno == EFAULT) return localFault(g.req, false), true;
        peerGone(std::string("reset the connection (") + std::strerror(errno) + ")");
        return true;
      }
      moved = true;
      g.done += r;
      if (g.done < g.len) return moved;
    }
    Request* req = g.req;
    s.recvq.pop_front();
    finishSegment(req);
    moved = true;
  }
  return moved;
}

bool TcpPair::progress() {
  if (failed_) return false;
  bool moved = false;
  for (size_t i = 0; i < socks_.size(); ++i) {
    Sock& s = socks_[i];
    if (!s.sendq.empty()) moved |= progressSend(s);
    if (failed_) return true;
    if (!s.recvq.empty()) moved |= progressRecv(s, static_cast<int>(i));
    if (failed_) return true;
  }
  return moved;
}

void TcpPair::handleIdle() {
  Sock& s = socks_[0];
  if (failed_ || !s.recvq.empty()) return;
  if (s.pending_have < sizeof(FrameHeader)) {
    ssize_t r = ::recv(s.fd, reinterpret_cast<char*>(&s.pending) + s.pending_have,
                       sizeof(FrameHeader) - s.pending_have, MSG_DONTWAIT);
    if (r == 0) return peerGone("closed the connection");
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      return peerGone(std::string("reset the connection (") + std::strerror(errno) + ")");
    }
    s.pending_have += r;
    if (s.pending_have < sizeof(FrameHeader)) return;
  }
  if (s.pending.kind == kData) return;  // kept until a receive is posted
  std::string text(std::min<uint64_t>(s.pending.len, 4096), '\0');
  try {
    if (!text.empty()) recvAll(s.fd, text.data(), text.size(), Deadline::after(2), who());
  } catch (const Error&) {
  }
  s.pending_have = 0;
  if (s.pending.kind == kBye) {
    peer_closed_ = true;
    return;
  }
  if (s.pending.kind == kAbort) {
    peer_gone_ = true;
    abort_text_ = who() + " aborted the communicator: " + text;
    return failAll(Request::kPeerFailure, who() + " aborted the communicator: " + text);
  }
  failAll(Request::kPeerFailure, "corrupt frame from " + who() + " (bad magic)");
}

void TcpPair::sendControl(FrameKind kind, const std::string& text) {
  Sock& s = socks_[0];
  if (s.fd < 0) return;
  // Only at a frame boundary; otherwise the peer will just see the socket close.
  if (!s.sendq.empty() && (s.sendq.front().hdr_done > 0 || s.sendq.front().done > 0)) return;
  FrameHeader h{static_cast<uint32_t>(kind), 0, 0, text.size()};
  std::string buf(reinterpret_cast<char*>(&h), sizeof h);
  buf += text;
  try {
    sendAll(s.fd, buf.data(), buf.size(), Deadline::after(1), who());
  } catch (const Error&) {
  }
}

// ---------------------------------------------------------------------------
TcpTransport::TcpTransport(const CommInfo& info, const std::vector<PeerInfo>& peers)
    : info_(info), peer_info_(peers) {
  nsocks_ = static_cast<int>(env::integer("HARP_NSOCKS_PERPEER"));
  if (nsocks_ < 1 || nsocks_ > 64) throw InvalidArgument("HARP_NSOCKS_PERPEER must be in 1..64");
  stripe_min_ = env::bytes("HARP_SOCKET_STRIPE_MIN");
  chunk_ = env::bytes("HARP_SOCKET_CHUNK");
  if (chunk_ == 0) throw InvalidArgument("HARP_SOCKET_CHUNK must be > 0");
  // Listen on the interface chosen by HARP_SOCKET_IFNAME, or the one that
  // reaches the bootstrap root (CommInfo::bind_hint).
  std::string bind = env::str("HARP_SOCKET_ADDR");
  if (bind.empty() && (env::has("HARP_SOCKET_IFNAME") || env::has("HARP_SOCKET_FAMILY"))) {
    auto itfs = findInterfaces("");
    if (itfs.empty())
      throw InvalidArgument("no network interface matches HARP_SOCKET_IFNAME='" + env::str("HARP_SOCKET_IFNAME") +
                            "' (HARP_SOCKET_FAMILY='" + env::str("HARP_SOCKET_FAMILY") + "')");
    listen_addr_ = itfs[0].addr;
  } else {
    listen_addr_ = SockAddr::parse(bind.empty() ? info.bind_hint : bind, 0);
  }
  listen_addr_.setPort(0);
  listen_fd_ = listenOn(listen_addr_);
  HARP_INFO("tcp: rank %d listens for its peers on %s", info.rank, listen_addr_.str().c_str());
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

TcpTransport::~TcpTransport() {
  for (auto& [peer, p] : pairs_) {
    if (!p->failed_ && !p->busy()) p->sendControl(kBye, "");
    for (auto& s : p->socks_)
      if (s.fd >= 0) ::shutdown(s.fd, SHUT_WR);
  }
  pairs_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void TcpTransport::connect(const std::vector<int>& peers, const std::vector<std::string>& remote) {
  Deadline dl = Deadline::after(info_.timeout_s);
  for (int p : peers) pairs_[p] = std::make_unique<TcpPair>(this, p, nsocks_);
  Handshake::Config cfg;
  cfg.transport = "tcp";
  cfg.key = info_.token;
  cfg.comm_id = info_.comm_id;
  cfg.rank = info_.rank;
  cfg.rank_name = [this](int r) { return rankName(r); };
  Handshake hs(cfg);
  for (size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    if (p < info_.rank) {
      SockAddr a = SockAddr::parse(remote[i], 0);
      for (int k = 0; k < nsocks_; ++k) hs.dial(p, k, a.ss, a.len, a.str());
    } else {
      for (int k = 0; k < nsocks_; ++k) hs.expect(p, k);
    }
  }
  hs.run(listen_fd_, dl);
  for (auto& [p, pr] : pairs_)
    for (int k = 0; k < nsocks_; ++k) pr->socks_[k].fd = hs.take(p, k);
  for (auto& [p, pr] : pairs_)
    for (auto& s : pr->socks_) {
      setNoDelay(s.fd);
      setNonBlocking(s.fd, true);
      size_t buf = env::bytes("HARP_SOCKET_BUFSIZE");
      if (buf) {
        int b = static_cast<int>(buf);
        setsockopt(s.fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
        setsockopt(s.fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
      }
    }
  ::close(listen_fd_);
  listen_fd_ = -1;
}

bool TcpTransport::progress() {
  std::lock_guard<std::mutex> drive(drive_mu_);
  if (abort_requested_.load(std::memory_order_relaxed)) doAbort();
  bool moved = false;
  for (auto& [peer, p] : pairs_) moved |= p->progress();
  return moved;
}

void TcpTransport::wait(int timeout_ms) {
  std::lock_guard<std::mutex> drive(drive_mu_);
  if (abort_requested_.load()) doAbort();
  std::vector<pollfd> pfds;
  std::vector<std::pair<TcpPair*, int>> who;
  pfds.push_back({wake_fd_, POLLIN, 0});
  who.push_back({nullptr, 0});
  for (auto& [peer, p] : pairs_) {
    if (p->failed_) continue;
    for (size_t i = 0; i < p->socks_.size(); ++i) {
      Sock& s = p->socks_[i];
      short ev = 0;
      if (!s.sendq.empty()) ev |= POLLOUT;
      if (!s.recvq.empty()) ev |= POLLIN;
      // Idle socket 0: watch for abort/goodbye frames and EOF, unless a data
      // header is already waiting for its receive to be posted.
      if (i == 0 && s.recvq.empty() && !p->peer_closed_ &&
          !(s.pending_have == sizeof(FrameHeader) && s.pending.kind == kData))
        ev |= POLLIN;
      if (!ev) continue;
      pfds.push_back({s.fd, ev, 0});
      who.push_back({p.get(), static_cast<int>(i)});
    }
  }
  int r = ::poll(pfds.data(), pfds.size(), timeout_ms);
  if (r <= 0) return;
  if (pfds[0].revents) {
    uint64_t v;
    ssize_t n = ::read(wake_fd_, &v, 8);
    (void)n;
  }
  for (size_t i = 1; i < pfds.size(); ++i) {
    if (!pfds[i].revents) continue;
    auto [p, idx] = who[i];
    if (idx == 0 && p->socks_[0].recvq.empty()) p->handleIdle();
  }
}

// One poll(2) over the idle sockets 0 (where notices arrive), then read what
// is there.
std::string TcpTransport::abortNotice() {
  std::lock_guard<std::mutex> drive(drive_mu_);
  pollfd pfds[64];
  TcpPair* who[64];
  int n = 0;
  for (auto& [peer, p] : pairs_) {
    if (!p->abort_text_.empty()) return p->abort_text_;
    Sock& s = p->socks_[0];
    if (p->failed_ || p->peer_closed_ || !s.recvq.empty() || s.fd < 0) continue;
    if (s.pending_have == sizeof(FrameHeader) && s.pending.kind == kData) continue;
    if (n < 64) pfds[n] = {s.fd, POLLIN, 0}, who[n++] = p.get();
  }
  if (n == 0 || ::poll(pfds, n, 0) <= 0) return "";
  for (int i = 0; i < n; ++i) {
    if (!pfds[i].revents) continue;
    who[i]->handleIdle();
    if (!who[i]->abort_text_.empty()) return who[i]->abort_text_;
  }
  return "";
}

void TcpTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(abort_mu_);
    if (abort_reason_.empty()) abort_reason_ = why;
  }
  abort_requested_.store(true);
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, 8);
  (void)n;
  // If no thread is driving this transport, do it here.
  std::unique_lock<std::mutex> drive(drive_mu_, std::try_to_lock);
  if (drive.owns_lock()) doAbort();
}

void TcpTransport::doAbort() {
  if (aborted_) return;
  aborted_ = true;
  std::string why;
  {
    std::lock_guard<std::mutex> g(abort_mu_);
    why = abort_reason_;
  }
  for (auto& [peer, p] : pairs_) {
    // A pair failed by a mismatch (our receive side out of step) still gets
    // the notice: our send side is at a frame boundary or sendControl skips it.
    if (!p->peer_gone_ && !p->peer_closed_) p->sendControl(kAbort, "rank " + std::to_string(info_.rank) + ": " + why);
    p->failAll(Request::kPeerFailure, "communicator aborted: " + why);
    // Half-close only: the peer reads its data, then the notice, then EOF;
    // SHUT_RD would make its sends fail with EPIPE (a "reset" that hides the
    // notice and its reason, e.g. a collective mismatch).
    for (auto& s : p->socks_)
      if (s.fd >= 0) ::shutdown(s.fd, SHUT_WR);
  }
}

HARP_REGISTER_TRANSPORT(([] {
  TransportSpec s;
  s.name = "tcp";
  s.priority = 10;
  s.unavailable = [] { return std::string(); };
  s.reachable = [](const PeerInfo&, const PeerInfo&) { return true; };
  s.create = [](const CommInfo& info, const std::vector<PeerInfo>& peers) -> std::unique_ptr<Transport> {
    return std::make_unique<TcpTransport>(info, peers);
  };
  return s;
}()));

}  // namespace
}  // namespace harp::transport
