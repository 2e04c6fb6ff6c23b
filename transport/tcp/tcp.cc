// transport/tcp/tcp.cc — HARP's TCP transport (kernel sockets): parameters,
// listening, connection setup, progress/wait, abort. The frame format is in
// tcp_wire.h, the per-peer lanes and adaptive striping in tcp_lane.cc
// (classes: tcp.h), the HARP_SOCKET_NSTREAMS=auto probe in tcp_probe.cc.
//
// Lanes per peer: HARP_SOCKET_NSTREAMS=N (HARP_NSOCKS_PERPEER, deprecated, when
// unset; default 1), or auto: peers on the same host get 1, peers on other
// hosts are probed at connect time (tcp_probe.cc). Messages of at least
// HARP_SOCKET_STRIPE_MIN (1M) are cut into HARP_SOCKET_CHUNK (512K) pieces,
// each taken by whichever lane has room. Sockets: TCP_NODELAY, optional
// HARP_TCP_CONGESTION and HARP_SOCKET_BUFSIZE, TCP_NOTSENT_LOWAT
// (HARP_SOCKET_LOWAT) on multi-lane pairs.
//
// One thread drives everything: progress() tries non-blocking send/recv on
// lanes with work; wait() poll(2)s every lane (POLLIN on idle lanes too, so
// abort notices and EOF from any peer are seen at once) plus an eventfd for
// cross-thread abort. No busy loops: the core spins briefly, then calls
// wait(), which blocks in the kernel.
//
// Connection setup: lower rank accepts, higher rank connects; each connection
// opens with the mutual challenge-response of transport/common/handshake.h (context
// "tcp|<comm id>|<connector>|<acceptor>|<lane>"), run for all lanes at once. A
// connection that fails it is refused and logged; nothing else is ever read
// from it. Then both ends exchange a LaneHello on lane 0 (lane count and chunk
// size; a disagreement fails connect naming the peer). HARP_SOCKET_CONNECT=lazy
// (auto: from HARP_SOCKET_LAZY_RANKS ranks) does the same per pair on its first
// message instead of at connect(), driven from progress() and wait(): a rank
// holds sockets only to the peers its algorithms talk to (ring: 2; recursive
// doubling: log2 p; a rooted call's descriptor check: all). A peer that never
// dials is only found by the keep-alive or the call's timeout.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include "base/env.h"
#include "base/log.h"
#include "transport/common/handshake.h"
#include "transport/tcp/tcp.h"

namespace harp::transport::tcp {

using namespace tcpwire;

void setCongestion(int fd, const std::string& name) {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), name.size()) == 0) return;
  int err = errno;
  std::string avail;
  std::ifstream f("/proc/sys/net/ipv4/tcp_available_congestion_control");
  std::getline(f, avail);
  throw InvalidArgument("HARP_TCP_CONGESTION='" + name + "': the kernel refuses this congestion control (" +
                        std::strerror(err) + "); available here: " + (avail.empty() ? "unknown" : avail) +
                        " (tcp_allowed_congestion_control limits unprivileged choices)");
}

static int parseStreams() {
  std::string v = env::str("HARP_SOCKET_NSTREAMS");
  if (v.empty()) {
    long long n = env::integer("HARP_NSOCKS_PERPEER");
    if (n < 1 || n > 64) throw InvalidArgument("HARP_NSOCKS_PERPEER must be in 1..64, not " + std::to_string(n));
    return static_cast<int>(n);
  }
  if (v == "auto") return 0;
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (*end || n < 1 || n > 64) throw InvalidArgument("HARP_SOCKET_NSTREAMS must be auto or a number in 1..64, not '" + v + "'");
  return static_cast<int>(n);
}

TcpTransport::TcpTransport(const CommInfo& info, const std::vector<PeerInfo>& peers)
    : info_(info), peer_info_(peers) {
  nstreams_ = parseStreams();
  stripe_min_ = env::bytes("HARP_SOCKET_STRIPE_MIN");
  chunk_ = env::bytes("HARP_SOCKET_CHUNK");
  if (chunk_ < kMinChunk || chunk_ > kMaxChunk)
    throw InvalidArgument("HARP_SOCKET_CHUNK must be in 4K..1G, not " + std::to_string(chunk_));
  lowat_ = env::bytes("HARP_SOCKET_LOWAT");
  bufsize_ = env::bytes("HARP_SOCKET_BUFSIZE");
  if (bufsize_ > (1u << 30)) throw InvalidArgument("HARP_SOCKET_BUFSIZE must be at most 1G");
  congestion_ = env::str("HARP_TCP_CONGESTION");
  fault_ = env::str("HARP_TCP_FAULT");
  // Listen on the interface chosen by HARP_SOCKET_IFNAME, or the one that
  // reaches the bootstrap root (CommInfo::bind_hint).
  std::string bind = env::str("HARP_SOCKET_ADDR");
  if (bind.empty() && (env::has("HARP_SOCKET_IFNAME") || env::has("HARP_SOCKET_FAMILY"))) {
    auto itfs = findInterfaces("");
    if (itfs.empty())
      throw InvalidArgument("no network interface matches HARP_SOCKET_IFNAME='" + env::str("HARP_SOCKET_IFNAME") +
                            "' (HARP_SOCKET_FAMILY='" + env::str("HARP_SOCKET_FAMILY") + "')");
    listen_addr_ = itfs[0].addr;
    for (auto& i : itfs)
      if (i.addr.family() == itfs[0].addr.family()) rails_.push_back(i.addr);
    if (rails_.size() > 1 && env::str("HARP_SOCKET_IFNAME").find(',') != std::string::npos) {
      // Rails (a list such as eth0,eth1): one listener on every interface; the
      // peers' lane k dials rail k % rails, so lanes spread over the NICs.
      listen_addr_ = SockAddr::parse(itfs[0].addr.family() == AF_INET6 ? "[::]" : "0.0.0.0", 0);
    } else {
      rails_.clear();
    }
  } else {
    listen_addr_ = SockAddr::parse(bind.empty() ? info.bind_hint : bind, 0);
  }
  listen_addr_.setPort(0);
  listen_fd_ = listenOn(listen_addr_);
  // A refused congestion control fails here, on every rank alike, before any peer waits on us.
  if (!congestion_.empty()) setCongestion(listen_fd_, congestion_);
  HARP_INFO("tcp: rank %d listens for its peers on %s", info.rank, localAddress(0).c_str());
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

TcpTransport::~TcpTransport() {
  for (auto& [peer, p] : pairs_) {
    if (!p->up_) continue;  // lazy set-up: never connected (its sockets, if any, close with it)
    if (!p->failed_) p->pushHeld(true);  // lazy sends still held go before the goodbye
    if (!p->failed_ && !p->busy()) p->sendControl(kBye, "");
    for (auto& l : p->lanes_)
      if (l.fd >= 0) ::shutdown(l.fd, SHUT_WR);
  }
  pairs_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

// "addr:port", or with rails "addr0:port,addr1:port,..." (one per interface).
std::string TcpTransport::localAddress(int) {
  if (rails_.empty()) return listen_addr_.str();
  std::string out;
  for (SockAddr a : rails_) {
    a.setPort(listen_addr_.port());
    out += (out.empty() ? "" : ",") + a.str();
  }
  return out;
}

static std::vector<SockAddr> parseRails(const std::string& blob) {
  std::vector<SockAddr> out;
  size_t at = 0;
  while (at <= blob.size() && out.size() < 64) {
    size_t comma = blob.find(',', at);
    out.push_back(SockAddr::parse(blob.substr(at, comma == std::string::npos ? std::string::npos : comma - at), 0));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::string TcpTransport::rankName(int r) const {
  std::string s = "rank " + std::to_string(r);
  if (r >= 0 && r < (int)peer_info_.size() && !peer_info_[r].hostname.empty())
    s += " (" + peer_info_[r].hostname + " pid " + std::to_string(peer_info_[r].pid) + ")";
  return s;
}

bool TcpTransport::sameHost(int peer) const {
  int me = info_.rank;
  if (me >= (int)peer_info_.size() || peer >= (int)peer_info_.size()) return false;
  return !peer_info_[me].host_id.empty() && peer_info_[me].host_id == peer_info_[peer].host_id;
}

int TcpTransport::lanesFor(int peer) const {
  if (nstreams_ > 0) return nstreams_;
  if (sameHost(peer) && !env::flag("HARP_SOCKET_PROBE_LOCAL")) return 1;
  return auto_max_;
}

void TcpTransport::configure(int fd) {
  setNoDelay(fd);
  setNonBlocking(fd, true);
  if (bufsize_) {
    int b = static_cast<int>(bufsize_);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
    // What the kernel allowed: it doubles the request (bookkeeping) and caps it at
    // net.core.wmem_max / rmem_max; a cap below the ask is said once per transport.
    int snd = 0, rcv = 0;
    socklen_t len = sizeof snd;
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len);
    len = sizeof rcv;
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len);
    if (!bufsize_reported_) {
      bufsize_reported_ = true;
      if (snd / 2 < b || rcv / 2 < b)
        HARP_WARN("HARP_SOCKET_BUFSIZE=%d: the kernel allowed SO_SNDBUF %d and SO_RCVBUF %d bytes (capped by "
                  "net.core.wmem_max / rmem_max; raise them to at least %d)", b, snd / 2, rcv / 2, b);
      else
        HARP_INFO("HARP_SOCKET_BUFSIZE=%d: the kernel allowed SO_SNDBUF %d and SO_RCVBUF %d bytes", b, snd / 2,
                  rcv / 2);
    }
  }
  if (!congestion_.empty()) setCongestion(fd, congestion_);
}

// Both ends tell each other their lane count and chunk size on lane 0.
std::string TcpTransport::checkHello(TcpPair& p, const LaneHello& theirs, bool* local) {
  *local = false;
  if (theirs.magic != kHelloMagic) return "bad lane hello from " + p.who() + " (another HARP version?)";
  if (theirs.lanes != p.lanes_.size()) {
    *local = true;
    return "TCP lanes disagree with " + p.who() + ": " + std::to_string(p.lanes_.size()) + " here, " +
           std::to_string(theirs.lanes) + " there (set HARP_SOCKET_NSTREAMS alike on every rank)";
  }
  if (theirs.chunk < kMinChunk || theirs.chunk > kMaxChunk)
    return "bad chunk size " + std::to_string(theirs.chunk) + " in the lane hello of " + p.who();
  p.peer_chunk_ = theirs.chunk;
  return "";
}

void TcpTransport::exchangeHello(TcpPair& p, Deadline dl) {
  LaneHello mine{kHelloMagic, static_cast<uint32_t>(p.lanes_.size()), chunk_}, theirs{};
  int fd = p.lanes_[0].fd;
  sendAll(fd, &mine, sizeof mine, dl, p.who());
  if (!recvAll(fd, &theirs, sizeof theirs, dl, p.who()))
    throw Error(Error::kPeerFailure, p.who() + " closed its TCP connection during the lane hello");
  bool local = false;
  std::string why = checkHello(p, theirs, &local);
  if (!why.empty()) {
    if (local) throw InvalidArgument(why);
    throw Error(Error::kPeerFailure, why);
  }
}

// The handshake of every connection (transport/common/handshake.h); keep_going: lazy set-up.
Handshake::Config TcpTransport::handshakeConfig(bool keep_going) {
  Handshake::Config cfg;
  cfg.transport = "tcp";
  cfg.key = info_.token;
  cfg.comm_id = info_.comm_id;
  cfg.rank = info_.rank;
  cfg.rank_name = [this](int r) { return rankName(r); };
  cfg.keep_going = keep_going;
  return cfg;
}

// TCP_NOTSENT_LOWAT (HARP_SOCKET_LOWAT) on the lanes of a multi-lane pair.
void TcpTransport::applyLowat(TcpPair& p) {
  if (p.lanes_.size() < 2 || !lowat_) return;
  int v = static_cast<int>(std::min<size_t>(lowat_, 1u << 30));
  for (auto& l : p.lanes_) setsockopt(l.fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v);
}

// HARP_SOCKET_CONNECT: eager (every pair at connect), lazy (on first use), auto
// (lazy from HARP_SOCKET_LAZY_RANKS ranks).
static bool connectLazily(int size) {
  std::string m = env::str("HARP_SOCKET_CONNECT");
  if (m == "lazy") return true;
  if (m == "eager") return false;
  return size >= env::integer("HARP_SOCKET_LAZY_RANKS");
}

void TcpTransport::connect(const std::vector<int>& peers, const std::vector<std::string>& remote) {
  if (connectLazily(info_.size)) return connectLazy(peers, remote);
  Deadline dl = Deadline::after(info_.timeout_s);
  for (int p : peers) pairs_[p] = std::make_unique<TcpPair>(this, p, lanesFor(p));
  Handshake hs(handshakeConfig(false));
  for (size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i], n = lanesFor(p);
    if (p < info_.rank) {
      std::vector<SockAddr> rails = parseRails(remote[i]);  // lanes spread over the peer's NICs
      for (int k = 0; k < n; ++k) {
        const SockAddr& a = rails[k % rails.size()];
        hs.dial(p, k, a.ss, a.len, a.str());
      }
    } else {
      for (int k = 0; k < n; ++k) hs.expect(p, k);
    }
  }
  hs.run(listen_fd_, dl);
  for (auto& [p, pr] : pairs_)
    for (size_t k = 0; k < pr->lanes_.size(); ++k) {
      pr->lanes_[k].fd = hs.take(p, static_cast<int>(k));
      configure(pr->lanes_[k].fd);
    }
  ::close(listen_fd_);
  listen_fd_ = -1;
  for (auto& [p, pr] : pairs_) exchangeHello(*pr, dl);
  // Pairs in increasing peer order on every rank: the probes of a rank's
  // pairs run in one global order (by (lower, higher) rank), so none waits in a cycle.
  for (auto& [p, pr] : pairs_) {
    if (nstreams_ == 0 && pr->lanes_.size() > 1) pr->dropLanes(probe(*pr, dl));
    applyLowat(*pr);
    HARP_INFO("tcp: rank %d to %s: %zu lane(s)", info_.rank, rankName(p).c_str(), pr->lanes_.size());
  }
}

// ---- lazy set-up ------------------------------------------------------------
// Pairs exist from the start, without sockets; the listener stays open and
// awaits every higher peer; a pair's first post dials a lower peer. The
// handshake (transport/common/handshake.h, keep_going) and the lane hellos run from
// progress() and wait(), so a rank serves its peers' dials whenever it is
// inside any call. A dial that fails for good fails the pair's requests.
// HARP_SOCKET_NSTREAMS=auto is not probed here: such pairs get one lane.
void TcpTransport::connectLazy(const std::vector<int>& peers, const std::vector<std::string>& remote) {
  lazy_hs_ = std::make_unique<Handshake>(handshakeConfig(true));
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  for (size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i], n = nstreams_ > 0 ? nstreams_ : 1;
    auto pr = std::make_unique<TcpPair>(this, p, n);
    pr->up_ = false;
    if (p < info_.rank) rails_of_[p] = parseRails(remote[i]);
    else
      for (int k = 0; k < n; ++k) lazy_hs_->expect(p, k);
    pairs_[p] = std::move(pr);
  }
  HARP_INFO("tcp: rank %d connects to its %zu peers on first use (HARP_SOCKET_CONNECT)", info_.rank, peers.size());
}

// Under drive_mu_ (TcpPair::isend/irecv).
void TcpTransport::dialPeer(TcpPair& p) {
  p.dialed_ = true;
  try {
    const std::vector<SockAddr>& rails = rails_of_.at(p.peer_);
    for (size_t k = 0; k < p.lanes_.size(); ++k) {
      const SockAddr& a = rails[k % rails.size()];
      lazy_hs_->dial(p.peer_, static_cast<int>(k), a.ss, a.len, a.str());
    }
  } catch (const Error& e) {
    p.failAll(Request::kPeerFailure, std::string("connecting to ") + p.who() + ": " + e.what());
  }
}

bool TcpTransport::readHello(TcpPair& p) {
  const size_t want = sizeof(LaneHello);
  while (p.hello_in_.size() < want) {
    char b[sizeof(LaneHello)];
    ssize_t r = ::recv(p.lanes_[0].fd, b, want - p.hello_in_.size(), MSG_DONTWAIT);
    if (r > 0) {
      p.hello_in_.append(b, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    p.failAll(Request::kPeerFailure, p.who() + " closed its TCP connection during the lane hello");
    return true;
  }
  LaneHello theirs;
  std::memcpy(&theirs, p.hello_in_.data(), want);
  bool local = false;
  std::string why = checkHello(p, theirs, &local);
  if (!why.empty()) {
    p.failAll(local ? Request::kLocal : Request::kPeerFailure, why);
    return true;
  }
  applyLowat(p);
  p.up_ = true;
  ++lazy_up_;
  HARP_INFO("tcp: rank %d to %s: %zu lane(s), connected on first use (%zu of %zu peers)", info_.rank,
            rankName(p.peer_).c_str(), p.lanes_.size(), lazy_up_, pairs_.size());
  return true;
}

// Under drive_mu_.
bool TcpTransport::serviceConnections() {
  if (!lazy_hs_ || aborted_) return false;
  bool moved = false;
  try {
    lazy_hs_->step(listen_fd_);
  } catch (const Error& e) {  // poll failing: every pair still waiting for its connection learns why
    for (auto& [peer, p] : pairs_)
      if (!p->up_ && !p->failed_) p->failAll(Request::kLocal, e.what());
    return true;
  }
  for (auto& [peer, why] : lazy_hs_->takeFailures()) {
    auto it = pairs_.find(peer);
    if (it != pairs_.end()) it->second->failAll(Request::kPeerFailure, why), moved = true;
  }
  std::map<int, size_t> ready;
  for (auto& k : lazy_hs_->ready()) ++ready[k.first];
  for (auto& [peer, n] : ready) {
    auto it = pairs_.find(peer);
    if (it == pairs_.end()) continue;
    TcpPair& p = *it->second;
    if (p.up_ || p.hello_sent_ || n < p.lanes_.size()) continue;
    for (size_t k = 0; k < p.lanes_.size(); ++k) p.lanes_[k].fd = lazy_hs_->take(peer, static_cast<int>(k));
    moved = true;
    if (p.failed_) continue;  // failed meanwhile: the sockets close with the pair
    try {
      for (auto& l : p.lanes_) configure(l.fd);
      // Ours now (a fresh socket takes 16 bytes at once); theirs as it comes.
      LaneHello mine{kHelloMagic, static_cast<uint32_t>(p.lanes_.size()), chunk_};
      sendAll(p.lanes_[0].fd, &mine, sizeof mine, Deadline::after(std::min(5.0, info_.timeout_s)), p.who());
    } catch (const Error& e) {
      p.failAll(Request::kPeerFailure, e.what());
      continue;
    }
    p.hello_sent_ = true;
    hello_wait_.push_back(&p);
  }
  for (size_t i = 0; i < hello_wait_.size();) {
    TcpPair* p = hello_wait_[i];
    if (p->failed_ || readHello(*p)) {
      moved = true;
      hello_wait_.erase(hello_wait_.begin() + i);
    } else {
      ++i;
    }
  }
  return moved;
}

bool TcpTransport::progress() {
  std::lock_guard<std::mutex> drive(drive_mu_);
  if (abort_requested_.load(std::memory_order_relaxed)) doAbort();
  // Lazy set-up: handshakes in flight are stepped every time; the listener alone
  // (a new dial) every 64th call, and in every wait().
  bool moved = false;
  if (lazy_hs_ && (lazy_hs_->busy() || !hello_wait_.empty() || (++lazy_polls_ & 63) == 0)) moved = serviceConnections();
  for (auto& [peer, p] : pairs_)
    if (p->up_) moved |= p->progress();
  return moved;
}

// Push the lazy sends the lanes hold (Request::lazy).
void TcpTransport::flushLocked() {
  if (!any_held_.exchange(false, std::memory_order_relaxed)) return;
  for (auto& [peer, p] : pairs_)
    if (p->up_) p->pushHeld();
}

void TcpTransport::flush() {
  if (!any_held_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> drive(drive_mu_);
  flushLocked();
}

void TcpTransport::wait(int timeout_ms) {
  std::lock_guard<std::mutex> drive(drive_mu_);
  if (abort_requested_.load()) doAbort();
  // Frames already read ahead (tcp.h, Lane::ahead) are no poll(2) event.
  bool ahead = false;
  for (auto& [peer, p] : pairs_)
    if (p->up_) ahead |= p->readAhead();
  if (ahead) return;
  std::vector<pollfd> pfds;
  std::vector<std::pair<TcpPair*, size_t>> who;
  pfds.push_back({wake_fd_, POLLIN, 0});
  who.push_back({nullptr, 0});
  for (auto& [peer, p] : pairs_) {
    if (p->failed_ || !p->up_) continue;
    for (size_t i = 0; i < p->lanes_.size(); ++i) {
      short ev = (p->wantsIn(i) ? POLLIN : 0) | (p->wantsOut(i) ? POLLOUT : 0);
      if (!ev) continue;
      pfds.push_back({p->lanes_[i].fd, ev, 0});
      who.push_back({p.get(), i});
    }
  }
  // Lazy sends wait while this rank waits briefly (a peer that needs them
  // blocks longer); a wait of more than kLazyHoldMs pushes them and returns.
  const bool held = any_held_.load(std::memory_order_relaxed);
  // Lazy set-up: the listener, the handshakes in flight and the lane hellos due.
  const size_t lanes_end = pfds.size();
  if (lazy_hs_ && !aborted_) {
    lazy_hs_->addPollFds(listen_fd_, pfds);
    for (TcpPair* p : hello_wait_) pfds.push_back({p->lanes_[0].fd, POLLIN, 0});
    if (lazy_hs_->retryDue()) timeout_ms = std::min(timeout_ms, 20);
  }
  int r = ::poll(pfds.data(), pfds.size(), held ? std::min(timeout_ms, kLazyHoldMs) : timeout_ms);
  if (r == 0 && held) flushLocked();
  if (lazy_hs_ && (r > 0 || lazy_hs_->retryDue())) {
    bool set_up = false;
    for (size_t i = lanes_end; i < pfds.size(); ++i) set_up |= pfds[i].revents != 0;
    if (set_up || lazy_hs_->retryDue()) serviceConnections();
  }
  if (r <= 0) return;
  if (pfds[0].revents) {
    uint64_t v;
    ssize_t n = ::read(wake_fd_, &v, 8);
    (void)n;
  }
  // Readable lanes are read now (notices and EOF of idle lanes, headers that
  // wait for their receive); progress() does the rest.
  for (size_t i = 1; i < lanes_end; ++i)
    if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) who[i].first->readIdle(who[i].second);
}

// One poll(2) over the idle lanes 0 (where notices arrive), then read what is there.
std::string TcpTransport::abortNotice() {
  std::lock_guard<std::mutex> drive(drive_mu_);
  pollfd pfds[64];
  TcpPair* who[64];
  int n = 0;
  for (auto& [peer, p] : pairs_) {
    if (!p->up_) continue;
    p->readAhead();
    if (!p->abort_text_.empty()) return p->abort_text_;
    if (!p->wantsIn(0) || p->lanes_[0].fd < 0) continue;
    if (n < 64) pfds[n] = {p->lanes_[0].fd, POLLIN, 0}, who[n++] = p.get();
  }
  if (n == 0 || ::poll(pfds, n, 0) <= 0) return "";
  for (int i = 0; i < n; ++i) {
    if (!pfds[i].revents) continue;
    who[i]->readIdle(0);
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
    for (auto& l : p->lanes_)
      if (l.fd >= 0) ::shutdown(l.fd, SHUT_WR);
  }
  // Lazy set-up: peers that dial now are refused at once and report this rank failed
  // (HARP_HANDSHAKE_REFUSED_S) instead of waiting for a handshake nobody drives.
  if (lazy_hs_ && listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
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

}  // namespace harp::transport::tcp
