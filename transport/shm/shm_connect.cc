// transport/shm/shm_connect.cc — setup and teardown of the shm transport:
// segment creation, the abstract unix socket over which segments (fds) are
// exchanged with SCM_RIGHTS, the CMA probe, liveness checks, and registration.
//
// Threading: construction, connect() and checkSockets() run on the driving
// thread only.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "base/env.h"
#include "base/log.h"
#include "bootstrap/socket.h"
#include "transport/common/handshake.h"
#include "transport/shm/shm_transport.h"

namespace harp::transport::shm {
namespace {

constexpr uint64_t kHelloMagic = 0x324f4c4c45484d53ull;  // "SMHELLO2"
}  // namespace

// Sent after the authenticated handshake, with the sender's segment fd.
struct Hello {
  uint64_t magic;
  uint64_t comm_id;
  int32_t rank;
  int32_t size;
  uint32_t nslots;
  uint32_t slot_bytes;
  uint64_t coll_chunk;
  uint64_t seg_bytes;
  uint64_t probe_addr;
  uint64_t probe_value;
};

namespace {
uint64_t fnv(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

sockaddr_un abstractAddr(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof(a.sun_path) - 1);
  a.sun_path[0] = '\0';  // abstract namespace: no file, gone when closed
  memcpy(a.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

bool waitFd(int fd, short ev, Deadline dl) {
  pollfd p{fd, ev, 0};
  for (;;) {
    int rc = ::poll(&p, 1, dl.remainingMs());
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Send `n` bytes with an optional fd attached to the first byte.
void sendWithFd(int sock, const void* p, size_t n, int fd, Deadline dl, const std::string& who) {
  const char* b = static_cast<const char*>(p);
  size_t off = 0;
  bool fd_sent = fd < 0;
  while (off < n) {
    iovec iov{const_cast<char*>(b + off), n - off};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      memset(ctl, 0, sizeof ctl);
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t k = ::sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      off += static_cast<size_t>(k);
      fd_sent = true;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitFd(sock, POLLOUT, dl))
        throw Error(Error::kTimeout, "shm transport: timed out sending the handshake to " + who);
      continue;
    }
    throw ErrnoError("shm transport: sending the handshake to " + who, errno);
  }
}

// Receive exactly `n` bytes; *fd gets an attached fd (or stays -1). Returns
// false on EOF before the first byte.
bool recvWithFd(int sock, void* p, size_t n, int* fd, Deadline dl, const std::string& who) {
  char* b = static_cast<char*>(p);
  size_t off = 0;
  while (off < n) {
    iovec iov{b + off, n - off};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)];
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t k = ::recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (k > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int nfd = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
          for (int i = 0; i < nfd; ++i) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (fd && *fd < 0) *fd = got; else ::close(got);
          }
        }
      }
      off += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) {
      if (off == 0) return false;
      throw Error(Error::kPeerFailure, "shm transport: " + who + " closed the connection mid-handshake");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitFd(sock, POLLIN, dl))
        throw Error(Error::kTimeout, "shm transport: timed out waiting for the handshake of " + who);
      continue;
    }
    throw ErrnoError("shm transport: receiving the handshake of " + who, errno);
  }
  return true;
}

int peerPid(int sock) {
  ucred c{};
  socklen_t l = sizeof c;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &l) != 0) return 0;
  return c.pid;
}

// "" if the process at the other end of unix socket `fd` runs as our uid or
// as root; otherwise why it is refused.
std::string vetPeerCredentials(int fd) {
  ucred c{};
  socklen_t l = sizeof c;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &l) != 0)
    return std::string("cannot read its credentials (SO_PEERCRED: ") + std::strerror(errno) + ")";
  if (c.uid == ::geteuid() || c.uid == 0) return "";
  return "its process (pid " + std::to_string(c.pid) + ") runs as uid " + std::to_string(c.uid) + ", not as ours (" +
         std::to_string(::geteuid()) + ") or root";
}

}  // namespace

ShmTransport::ShmTransport(const CommInfo& info, const std::vector<PeerInfo>& peers)
    : info_(info), peers_(peers) {
  local_of_.assign(info_.size, -1);
  const std::string& me = peers_.at(info_.rank).host_id;
  for (int r = 0; r < info_.size; ++r)
    if (r < static_cast<int>(peers_.size()) && peers_[r].host_id == me) local_of_[r] = nlocal_++;
  geo_.nlocal = nlocal_;
  // 32 slots per ring up to 8 ranks per host, fewer beyond (memory grows with
  // the square of the local rank count); at least 8.
  const long def_slots = std::max(8, std::min(32, 256 / std::max(1, nlocal_)));
  geo_.nslots = static_cast<uint32_t>(env::integerOr("HARP_SHM_SLOTS", def_slots));
  geo_.slot_bytes = static_cast<uint32_t>(env::bytes("HARP_SHM_SLOT_BYTES"));
  if (geo_.nslots < 2 || geo_.nslots > 65536)
    throw InvalidArgument("HARP_SHM_SLOTS=" + std::to_string(geo_.nslots) + " must be in 2..65536");
  if (geo_.slot_bytes < 256 || geo_.slot_bytes % kLine || geo_.slot_bytes > (64u << 20))
    throw InvalidArgument("HARP_SHM_SLOT_BYTES=" + std::to_string(geo_.slot_bytes) +
                          " must be a multiple of 64 between 256 and 64M");
  size_t coll = env::bytes("HARP_SHM_COLL_BYTES");
  geo_.coll_chunk = alignUp(coll, 4096);
  cma_threshold_ = env::bytes("HARP_SHM_CMA_BYTES");
  cma_piece_ = env::bytes("HARP_SHM_CMA_PIECE");
  if (cma_piece_ == 0) cma_piece_ = 4 << 20;
  // More ranks here than cores to run them: spinning only delays the rank we
  // wait for (measured, 4 ranks bound 2 per core, 8-byte allreduce: 6.5 us
  // with 2 us of spinning per wait, 4.5 us with none). Yield at once instead.
  const bool oversubscribed = nlocal_ > env::availableCpus();
  inline_polls_ = oversubscribed ? 1 : 64;
  spin_ns_ = static_cast<long>(env::realOr("HARP_SHM_SPIN_US", oversubscribed ? 0 : 2) * 1000);
  yield_ns_ = static_cast<long>(env::real("HARP_SHM_YIELD_US") * 1000);
  check_delay_ns_ = static_cast<long>(env::real("HARP_SHM_FAULT_CHECK_DELAY_US") * 1000);

  seg_ = createSegment(geo_, &seg_how_);
  SegHeader* h = seg_.header();
  h->magic = kSegMagic;
  h->version = kSegVersion;
  h->rank = info_.rank;
  h->nlocal = nlocal_;
  h->pid = static_cast<int32_t>(getpid());
  h->comm_id = info_.comm_id;
  probe_word_ = kHelloMagic ^ info_.comm_id ^ (static_cast<uint64_t>(info_.rank) << 32);
  pairs_.resize(info_.size);
  HARP_TRACE("shm: segment %zu bytes via %s, %d ranks on this host", seg_.bytes, seg_how_.c_str(), nlocal_);
}

ShmTransport::~ShmTransport() {
  for (auto& p : pairs_) p.reset();  // closes sockets: peers see EOF
  if (listen_fd_ >= 0) ::close(listen_fd_);
  seg_.unmap();
}

ShmPair::~ShmPair() {
  if (sock_ >= 0) ::close(sock_);
  seg_.unmap();
}

std::string ShmTransport::rankName(int r) const {
  std::string s = "rank " + std::to_string(r);
  if (r >= 0 && r < static_cast<int>(peers_.size())) {
    int pid = peers_[r].pid;
    if (r < static_cast<int>(pairs_.size()) && pairs_[r] && pairs_[r]->pid_ > 0) pid = pairs_[r]->pid_;
    s += " (pid " + std::to_string(pid) + " on " + peers_[r].hostname + ")";
  }
  return s;
}

std::string ShmTransport::localAddress(int /*peer*/) {
  if (listen_fd_ < 0) {
    char name[96];
    uint64_t salt = fnv(std::to_string(getpid()) + std::to_string(reinterpret_cast<uintptr_t>(this)) +
                            std::to_string(Clock::now().time_since_epoch().count()),
                        info_.comm_id);
    snprintf(name, sizeof name, "harp-shm-%016llx-%d-%016llx", (unsigned long long)info_.comm_id, info_.rank,
             (unsigned long long)salt);
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw ErrnoError("shm transport: socket(AF_UNIX)", errno);
    socklen_t len;
    sockaddr_un a = abstractAddr(name, &len);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 256) != 0) {
      int e = errno;
      ::close(fd);
      throw ErrnoError(std::string("shm transport: bind/listen on abstract unix socket @") + name, e);
    }
    listen_fd_ = fd;
    sock_name_ = name;
    HARP_INFO_S(LogSubsys::kShm, "shm: rank %d listens for its peers on @%s", info_.rank, name);
  }
  return "shm1:" + sock_name_;
}

// Closes the received segment fds that were not mapped, whatever way connect() ends.
struct FdList {
  std::vector<int> fd;
  explicit FdList(int n) : fd(n, -1) {}
  ~FdList() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

Hello ShmTransport::myHello() const {
  Hello mine{};
  mine.magic = kHelloMagic;
  mine.comm_id = info_.comm_id;
  mine.rank = info_.rank;
  mine.size = info_.size;
  mine.nslots = geo_.nslots;
  mine.slot_bytes = geo_.slot_bytes;
  mine.coll_chunk = geo_.coll_chunk;
  mine.seg_bytes = seg_.bytes;
  mine.probe_addr = reinterpret_cast<uint64_t>(&probe_word_);
  mine.probe_value = probe_word_;
  return mine;
}

// Steps 1-2: the authenticated hello of transport/common/handshake.h on one abstract
// unix socket per pair (lower rank connects), run for all peers at once; only
// processes of our uid (or root) are even answered (SO_PEERCRED), and the peer
// must be the process the peer rank published.
void ShmTransport::authenticate(const std::vector<int>& peers, const std::vector<std::string>& remote, Deadline dl) {
  Handshake::Config cfg;
  cfg.transport = "shm";
  cfg.key = info_.token;
  cfg.comm_id = info_.comm_id;
  cfg.rank = info_.rank;
  cfg.rank_name = [this](int r) { return rankName(r); };
  cfg.vet = [](int fd) { return vetPeerCredentials(fd); };
  Handshake hs(cfg);
  for (size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    if (p < info_.rank) {
      hs.expect(p, 0);
      continue;
    }
    const std::string& blob = remote.at(i);
    if (blob.rfind("shm1:", 0) != 0 || blob.size() < 6)
      throw Error(Error::kSystem, "shm transport: " + rankName(p) + " published a bad address '" + blob + "'");
    sockaddr_storage ss{};
    socklen_t len;
    sockaddr_un a = abstractAddr(blob.substr(5), &len);
    std::memcpy(&ss, &a, len);
    hs.dial(p, 0, ss, len, "@" + blob.substr(5));
  }
  hs.run(listen_fd_, dl);
  for (int p : peers) {
    pairs_[p]->sock_ = hs.take(p, 0);
    int pid = peerPid(pairs_[p]->sock_);
    if (peers_[p].pid > 0 && pid > 0 && pid != peers_[p].pid)
      throw Error(Error::kSystem, "shm transport: the process that authenticated as " + rankName(p) + " has pid " +
                                      std::to_string(pid) + ", but rank " + std::to_string(p) + " published pid " +
                                      std::to_string(peers_[p].pid) +
                                      " (ranks in different pid namespaces? use HARP_TRANSPORT=tcp for them)");
  }
}

void ShmTransport::connect(const std::vector<int>& peers, const std::vector<std::string>& remote) {
  try {
    connectPeers(peers, remote);
  } catch (...) {
    // Nothing of a failed set-up survives: peers' segments unmapped, sockets closed.
    active_.clear();
    for (auto& p : pairs_) p.reset();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    throw;
  }
}

void ShmTransport::connectPeers(const std::vector<int>& peers, const std::vector<std::string>& remote) {
  Deadline dl = Deadline::after(info_.timeout_s);
  if (listen_fd_ < 0) localAddress(0);
  for (int p : peers) {
    if (p < 0 || p >= info_.size || p == info_.rank)
      throw InvalidArgument("shm transport: bad peer rank " + std::to_string(p));
    if (local_of_[p] < 0)
      throw Error(Error::kUnavailable, "shm transport cannot reach " + rankName(p) +
                                           ": it is on another host or in another network/IPC namespace "
                                           "(host id '" + peers_[p].host_id + "' vs '" +
                                           peers_[info_.rank].host_id + "')");
    pairs_[p] = std::make_unique<ShmPair>(this, p);
  }
  authenticate(peers, remote, dl);
  ::close(listen_fd_);  // the abstract name disappears with it
  listen_fd_ = -1;
  // 3. Exchange hellos + segment fds with authenticated peers only.
  const Hello mine = myHello();
  std::vector<Hello> hello(info_.size);
  FdList memfd(info_.size);
  for (int p : peers) sendWithFd(pairs_[p]->sock_, &mine, sizeof mine, seg_.fd, dl, rankName(p));
  for (int p : peers) {
    Hello& h = hello[p];
    if (!recvWithFd(pairs_[p]->sock_, &h, sizeof h, &memfd.fd[p], dl, rankName(p)))
      throw Error(Error::kPeerFailure, "shm transport: " + rankName(p) + " closed the connection during setup");
    if (h.magic != kHelloMagic || h.comm_id != info_.comm_id || h.rank != p || memfd.fd[p] < 0)
      throw Error(Error::kSystem, "shm transport: bad hello from " + rankName(p) + " after authentication");
  }
  // 4. Map segments, wire the rings, probe CMA (can we read the peer's memory?).
  for (int p : peers) {
    ShmPair* pr = pairs_[p].get();
    const Hello& h = hello[p];
    if (h.nslots != geo_.nslots || h.slot_bytes != geo_.slot_bytes || h.coll_chunk != geo_.coll_chunk ||
        h.seg_bytes != seg_.bytes) {
      throw InvalidArgument("shm transport: " + rankName(p) +
                            " uses different HARP_SHM_SLOTS / HARP_SHM_SLOT_BYTES / HARP_SHM_COLL_BYTES "
                            "settings than this rank; set them identically on every rank");
    }
    int fd = memfd.fd[p];
    memfd.fd[p] = -1;  // mapSegment closes it, mapped or not
    pr->seg_ = mapSegment(fd, geo_, rankName(p));
    pr->local_ = local_of_[p];
    pr->pid_ = peerPid(pr->sock_);
    if (pr->pid_ <= 0) pr->pid_ = pr->seg_.header()->pid;
    pr->peer_hdr_ = pr->seg_.header();
    pr->out_ctl_ = pr->seg_.ctl(local_of_[info_.rank]);
    pr->out_slots_ = pr->seg_.slots(local_of_[info_.rank]);
    pr->in_ctl_ = seg_.ctl(local_of_[p]);
    pr->in_slots_ = seg_.slots(local_of_[p]);
    pr->nslots_ = geo_.nslots;
    pr->slot_bytes_ = geo_.slot_bytes;
    uint64_t v = 0;
    iovec l{&v, sizeof v}, r{reinterpret_cast<void*>(h.probe_addr), sizeof v};
    ssize_t k = process_vm_readv(pr->pid_, &l, 1, &r, 1, 0);
    int err = errno;
    char can = (k == static_cast<ssize_t>(sizeof v) && v == h.probe_value) ? 1 : 0;
    if (!can)
      HARP_INFO_S(LogSubsys::kShm, "shm: cannot read the memory of %s with process_vm_readv (%s); large messages to it "
                "go through the ring", rankName(p).c_str(), k < 0 ? std::strerror(err) : "wrong value");
    if (!env::flag("HARP_SHM_CMA")) can = 0;
    pr->cma_in_ = can == 1;  // what we offer: a single-copy descriptor from a peer we refused is a protocol error
    sendWithFd(pr->sock_, &can, 1, -1, dl, rankName(p));
  }
  for (int p : peers) {
    char can = 0;
    if (!recvWithFd(pairs_[p]->sock_, &can, 1, nullptr, dl, rankName(p)))
      throw Error(Error::kPeerFailure, "shm transport: " + rankName(p) + " closed the connection during setup");
    pairs_[p]->cma_ = can == 1;  // the peer can read our memory: single-copy sends to it
    active_.push_back(pairs_[p].get());
  }
  HARP_INFO_S(LogSubsys::kShm, "shm: connected %zu peers (segment %zu KB via %s, %u slots x %u B, CMA above %zu B)",
            peers.size(), seg_.bytes >> 10, seg_how_.c_str(), geo_.nslots, geo_.slot_bytes, cma_threshold_);
}

Pair* ShmTransport::pair(int peer) {
  if (peer < 0 || peer >= static_cast<int>(pairs_.size()) || !pairs_[peer])
    throw InvalidArgument("shm transport: no pair for rank " + std::to_string(peer));
  return pairs_[peer].get();
}

void ShmTransport::checkSockets() {
  if (active_.empty()) return;
  std::vector<pollfd> fds;
  fds.reserve(active_.size());
  for (ShmPair* p : active_) fds.push_back({p->dead_ ? -1 : p->sock_, POLLIN, 0});
  int rc = ::poll(fds.data(), fds.size(), 0);
  if (rc <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    ShmPair* p = active_[i];
    char buf[64];
    ssize_t k = ::recv(p->sock_, buf, sizeof buf, MSG_DONTWAIT);
    if (k == 0)
      p->markDead(rankName(p->peer_) + " closed its shared-memory connection (it exited, was killed, "
                                       "or destroyed the communicator)");
    else if (k < 0 && errno != EAGAIN && errno != EINTR)
      p->markDead("connection to " + rankName(p->peer_) + " failed: " + std::strerror(errno));
  }
}

// ---- Registration -----------------------------------------------------------
namespace {
TransportSpec makeSpec() {
  TransportSpec s;
  s.name = "shm";
  s.priority = 30;
  s.unavailable = [] { return std::string(); };
  s.reachable = [](const PeerInfo& self, const PeerInfo& peer) {
    return !self.host_id.empty() && self.host_id == peer.host_id;
  };
  s.create = [](const CommInfo& info, const std::vector<PeerInfo>& peers) -> std::unique_ptr<Transport> {
    return std::make_unique<ShmTransport>(info, peers);
  };
  return s;
}
}  // namespace
HARP_REGISTER_TRANSPORT(makeSpec());

}  // namespace harp::transport::shm
