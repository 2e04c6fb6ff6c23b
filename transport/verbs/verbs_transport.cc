// transport/verbs/verbs_transport.cc — HARP's RDMA verbs transport: device
// resources, connection setup, progress (poll the completion queue), blocking
// (completion channel + eventfd), abort, and registration with the registry.
//
// Threading: see verbs.h. progress(), wait(), isend() and irecv() run on the
// driving thread under drive_mu_; abort() from any thread.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "base/env.h"
#include "base/log.h"
#include "bootstrap/socket.h"
#include "base/types.h"
#include "transport/verbs/verbs.h"

namespace harp::transport::verbs {

namespace {
std::string probeOnce() {
  static std::string why = [] {
    DeviceChoice d;
    std::string w;
    try {
      if (probeDevice(&d, &w)) return std::string();
    } catch (const std::exception& e) {
      w = e.what();
    }
    return w.empty() ? std::string("no usable RDMA device") : w;
  }();
  return why;
}

int clampInt(long long v, long long lo, long long hi) { return static_cast<int>(std::max(lo, std::min(hi, v))); }
}  // namespace

VerbsTransport::VerbsTransport(const CommInfo& info, const std::vector<PeerInfo>& peers)
    : info_(info), peer_info_(peers) {
  std::string why;
  if (!probeDevice(&dev_, &why)) throw Error(Error::kUnavailable, "verbs: " + why);
  rq_credits_ = clampInt(env::integer("HARP_IB_RQ_DEPTH"), 8, 4096);
  rq_reserve_ = 16;
  sq_depth_ = clampInt(env::integer("HARP_IB_SQ_DEPTH"), 8, 4096);
  max_chunk_ = env::bytes("HARP_IB_CHUNK");
  eager_max_ = env::bytes("HARP_IB_EAGER");
  if (eager_max_ > (1u << 20)) throw InvalidArgument("HARP_IB_EAGER: at most 1M");
  eager_slots_ = clampInt(env::integer("HARP_IB_EAGER_SLOTS"), 1, 1024);
  ka_ms_ = clampInt(env::integer("HARP_IB_KEEPALIVE_MS"), 10, 600000);
  qp_timeout_ = static_cast<uint8_t>(clampInt(env::integer("HARP_IB_TIMEOUT"), 1, 31));
  retry_cnt_ = static_cast<uint8_t>(clampInt(env::integer("HARP_IB_RETRY_CNT"), 0, 7));

  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n && !ctx_; ++i)
    if (dev_.name == ibv_get_device_name(list[i])) ctx_ = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  if (!ctx_) throw ErrnoError("verbs: ibv_open_device(" + dev_.name + ")", errno);
  ibv_device_attr da{};
  if (ibv_query_device(ctx_, &da) == 0) {
    int cap = std::max(8, da.max_qp_wr - rq_reserve_);
    rq_credits_ = std::min(rq_credits_, cap);
    sq_depth_ = std::min(sq_depth_, cap);
  }
  if (dev_.max_msg_sz) max_chunk_ = std::min<size_t>(max_chunk_, dev_.max_msg_sz);
  if (max_chunk_ == 0) max_chunk_ = 1ull << 30;

  pd_ = ibv_alloc_pd(ctx_);
  if (!pd_) throw ErrnoError("verbs: ibv_alloc_pd on " + dev_.name, errno);
  chan_ = ibv_create_comp_channel(ctx_);
  if (!chan_) throw ErrnoError("verbs: ibv_create_comp_channel on " + dev_.name, errno);
  int fl = fcntl(chan_->fd, F_GETFL);
  fcntl(chan_->fd, F_SETFL, fl | O_NONBLOCK);
  int npeers = std::max(1, info.size - 1);
  int cqe = npeers * (rq_credits_ + sq_depth_ + 2 * rq_reserve_) + 64;
  if (da.max_cqe > 0) cqe = std::min(cqe, da.max_cqe);
  cq_ = ibv_create_cq(ctx_, cqe, nullptr, chan_, 0);
  if (!cq_) throw ErrnoError("verbs: ibv_create_cq(" + std::to_string(cqe) + " entries) on " + dev_.name, errno);
  ka_mr_ = ibv_reg_mr(pd_, ka_buf_, sizeof ka_buf_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!ka_mr_) throw ErrnoError("verbs: ibv_reg_mr (keepalive target)", errno);
  mrs_ = std::make_unique<MrCache>(pd_);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw ErrnoError("verbs: eventfd", errno);
  HARP_INFO("verbs: rank %d uses %s port %d (%s, GID[%d] %s %s, MTU %d), MR cache %s", info_.rank, dev_.name.c_str(),
            dev_.port, linkLayerName(dev_.link_layer), dev_.gid_index, gidString(dev_.gid).c_str(),
            dev_.gid_type.c_str(), 128 << dev_.active_mtu, mrs_->lazy() ? "lazy" : "safe");
}

VerbsTransport::~VerbsTransport() {
  {
    std::lock_guard<std::mutex> g(drive_mu_);
    // Goodbye to live peers (bounded wait for the sends to leave), then tear down.
    for (auto& [p, pair] : pairs_) pair->sendBye();
    auto until = Clock::now() + std::chrono::milliseconds(200);
    for (;;) {
      pollCq();
      bool pending = false;
      for (auto& [p, pair] : pairs_)
        if (pair->closing() && !pair->notice_done_) pending = true;
      if (!pending || Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (mrs_) {
      const MrStats& s = mrs_->stats();
      HARP_INFO("verbs: MR cache (%s): registrations=%llu hits=%llu deregistrations=%llu evictions=%llu live=%zu",
                mrs_->lazy() ? "lazy" : "safe", (unsigned long long)s.registrations, (unsigned long long)s.hits,
                (unsigned long long)s.deregistrations, (unsigned long long)s.evictions, mrs_->size());
      // For tests and tuning: one line per closed transport, appended.
      std::string path = env::str("HARP_IB_STATS_FILE");
      if (!path.empty()) {
        if (FILE* f = std::fopen(path.c_str(), "a")) {
          std::fprintf(f, "rank=%d mode=%s registrations=%llu hits=%llu deregistrations=%llu evictions=%llu live=%zu\n",
                       info_.rank, mrs_->lazy() ? "lazy" : "safe", (unsigned long long)s.registrations,
                       (unsigned long long)s.hits, (unsigned long long)s.deregistrations,
                       (unsigned long long)s.evictions, mrs_->size());
          std::fclose(f);
        }
      }
    }
    pairs_.clear();
    by_index_.clear();
  }
  mrs_.reset();
  if (unacked_events_ && cq_) ibv_ack_cq_events(cq_, unacked_events_);
  if (ka_mr_) ibv_dereg_mr(ka_mr_);
  if (cq_) ibv_destroy_cq(cq_);
  if (chan_) ibv_destroy_comp_channel(chan_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

std::string VerbsTransport::rankName(int r) const {
  std::string s = "rank " + std::to_string(r);
  if (r >= 0 && r < static_cast<int>(peer_info_.size()) && !peer_info_[r].hostname.empty())
    s += " (" + peer_info_[r].hostname + " pid " + std::to_string(peer_info_[r].pid) + ")";
  return s;
}

std::string VerbsTransport::localAddress(int peer) {
  std::lock_guard<std::mutex> g(drive_mu_);
  auto it = pairs_.find(peer);
  if (it == pairs_.end()) {
    auto p = std::make_unique<VerbsPair>(this, peer, static_cast<uint32_t>(by_index_.size()));
    p->create();
    by_index_.push_back(p.get());
    it = pairs_.emplace(peer, std::move(p)).first;
  }
  Blob b = it->second->localBlob();
  return std::string(reinterpret_cast<const char*>(&b), sizeof b);
}

Pair* VerbsTransport::pair(int peer) {
  auto it = pairs_.find(peer);
  return it == pairs_.end() ? nullptr : it->second.get();
}

void VerbsTransport::connect(const std::vector<int>& peers, const std::vector<std::string>& remote) {
  auto deadline = Deadline::after(info_.timeout_s).at;  // saturates at kForeverS (HARP_TIMEOUT=inf)
  {
    std::lock_guard<std::mutex> g(drive_mu_);
    for (size_t i = 0; i < peers.size(); ++i) {
      int p = peers[i];
      if (!pairs_.count(p))
        throw Error(Error::kInternal, "verbs: connect() to " + rankName(p) + " without localAddress() first");
      if (remote[i].size() != sizeof(Blob))
        throw Error(Error::kInternal, "verbs: " + rankName(p) + " published a " + std::to_string(remote[i].size()) +
                                          "-byte address, expected " + std::to_string(sizeof(Blob)) +
                                          " (different HARP versions?)");
      Blob b;
      std::memcpy(&b, remote[i].data(), sizeof b);
      pairs_.at(p)->connectTo(b);
    }
  }
  // Wait for every hello to be delivered both ways. A hello sent before the
  // peer's queue pair was ready fails after the retries; start that pair over.
  int resets = 0;
  for (;;) {
    std::vector<int> waiting;
    {
      std::lock_guard<std::mutex> g(drive_mu_);
      pollCq();
      for (int p : peers) {
        VerbsPair* pr = pairs_.at(p).get();
        if (pr->failed()) throw Error(Error::kPeerFailure, "verbs: connecting to " + rankName(p) + ": " + pr->fail_reason_);
        if (pr->helloFailed() && Clock::now() < deadline) {
          ++resets;
          pr->resetForRetry();
        }
        if (!pr->helloDone()) waiting.push_back(p);
      }
    }
    if (waiting.empty()) break;
    if (Clock::now() >= deadline) {
      std::string who;
      for (int p : waiting) who += (who.empty() ? "" : ", ") + rankName(p);
      throw Error(Error::kTimeout, "verbs: " + who + " did not complete the RDMA handshake within " +
                                       formatSeconds(info_.timeout_s) +
                                       " s (dead, or unreachable from " + dev_.name + " GID " + gidString(dev_.gid) +
                                       ": check HARP_IB_HCA / HARP_IB_GID_INDEX on both sides)");
    }
    wait(20);
  }
  if (resets) HARP_INFO("verbs: handshake needed %d queue pair restart(s)", resets);
}

bool VerbsTransport::pollCq() {
  ibv_wc wc[32];
  bool any = false;
  for (;;) {
    int n = ibv_poll_cq(cq_, 32, wc);
    if (n < 0) {
      for (auto& [p, pair] : pairs_) pair->fail("verbs: ibv_poll_cq failed on " + dev_.name);
      return true;
    }
    for (int i = 0; i < n; ++i) {
      uint32_t idx = static_cast<uint32_t>(wc[i].wr_id >> 32) & 0xffffff;
      auto kind = static_cast<WrKind>(wc[i].wr_id >> 56);
      if (idx >= by_index_.size()) continue;
      if (kind == kWrRecv) by_index_[idx]->onRecvCompletion(wc[i]);
      else by_index_[idx]->onSendCompletion(wc[i]);
    }
    if (n > 0) any = true;
    if (n < 32) return any;
  }
}

bool VerbsTransport::drive() {
  bool moved = pollCq();
  auto now = Clock::now();
  for (VerbsPair* p : by_index_) {
    if (p->closing()) {
      moved |= p->finishClosing(now);
      continue;
    }
    moved |= p->pump();
    if (p->keepaliveDue(now)) p->keepalive(now);
  }
  return moved;
}

bool VerbsTransport::progress() {
  std::lock_guard<std::mutex> g(drive_mu_);
  if (abort_requested_.load(std::memory_order_relaxed)) doAbort();
  return drive();
}

void VerbsTransport::wait(int timeout_ms) {
  std::lock_guard<std::mutex> g(drive_mu_);
  if (abort_requested_.load()) doAbort();
  if (drive() || timeout_ms <= 0) return;
  // Arm the CQ, then look once more (an entry may have landed before arming).
  if (!armed_) {
    if (ibv_req_notify_cq(cq_, 0) == 0) armed_ = true;
  }
  if (drive()) return;
  // Wake in time for keepalives and closing deadlines.
  auto now = Clock::now();
  long long ms = timeout_ms;
  for (VerbsPair* p : by_index_) {
    if (p->closing()) {
      ms = std::min<long long>(ms, std::chrono::duration_cast<std::chrono::milliseconds>(p->closing_deadline_ - now).count() + 1);
    } else if (p->busy() && !p->failed()) {
      auto due = std::max(p->last_heard_, p->last_ka_) + std::chrono::milliseconds(ka_ms_);
      ms = std::min<long long>(ms, std::chrono::duration_cast<std::chrono::milliseconds>(due - now).count() + 1);
    }
  }
  ms = std::max<long long>(ms, 0);
  pollfd pfd[2] = {{chan_->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  int r = ::poll(pfd, 2, static_cast<int>(ms));
  if (r > 0 && (pfd[0].revents & POLLIN)) {
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (ibv_get_cq_event(chan_, &cq, &cq_ctx) == 0) {
      ++unacked_events_;
      armed_ = false;
    }
    if (unacked_events_ >= 64) {
      ibv_ack_cq_events(cq_, unacked_events_);
      unacked_events_ = 0;
    }
  }
  if (r > 0 && (pfd[1].revents & POLLIN)) {
    uint64_t v;
    ssize_t n = ::read(wake_fd_, &v, sizeof v);
    (void)n;
  }
  if (abort_requested_.load()) doAbort();
  drive();
}

void VerbsTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(abort_mu_);
    if (abort_reason_.empty()) abort_reason_ = why;
  }
  abort_requested_.store(true);
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  (void)n;
  std::unique_lock<std::mutex> drive(drive_mu_, std::try_to_lock);
  if (drive.owns_lock()) doAbort();
}

// Tell every live peer (bounded: 200 ms for the notices to leave), then fail
// everything pending with the reason.
void VerbsTransport::doAbort() {
  if (aborted_) return;
  aborted_ = true;
  std::string why;
  {
    std::lock_guard<std::mutex> g(abort_mu_);
    why = abort_reason_;
  }
  std::string text = "rank " + std::to_string(info_.rank) + ": " + why;
  for (VerbsPair* p : by_index_) p->closeWithNotice(kAbort, text, "communicator aborted: " + why);
  auto until = Clock::now() + std::chrono::milliseconds(250);
  for (;;) {
    pollCq();
    bool pending = false;
    auto now = Clock::now();
    for (VerbsPair* p : by_index_) {
      p->finishClosing(now);
      if (p->closing()) pending = true;
    }
    if (!pending || now >= until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (VerbsPair* p : by_index_) p->fail("communicator aborted: " + why);
}

void VerbsTransport::registerMemory(void* p, size_t n) {
  std::lock_guard<std::mutex> g(drive_mu_);
  mrs_->pin(p, n);
}

void VerbsTransport::deregisterMemory(void* p) {
  std::lock_guard<std::mutex> g(drive_mu_);
  mrs_->unpin(p);
}

HARP_REGISTER_TRANSPORT(([] {
  TransportSpec s;
  s.name = "verbs";
  s.priority = 20;
  s.unavailable = [] { return probeOnce(); };
  // Both ends must list verbs as usable (the core checks); link layers are
  // compared when the queue pairs connect, with an error naming both devices.
  s.reachable = [](const PeerInfo&, const PeerInfo&) { return true; };
  s.create = [](const CommInfo& info, const std::vector<PeerInfo>& peers) -> std::unique_ptr<Transport> {
    return std::make_unique<VerbsTransport>(info, peers);
  };
  return s;
}()));

}  // namespace harp::transport::verbs
