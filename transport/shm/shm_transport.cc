// transport/shm/shm_transport.cc — the data path of the shm transport: ring
// slots, single-copy (CMA) reads, progress, blocking, abort and failure.
// Protocol: PROTOCOL.md. Threading: see shm_transport.h (abort() is the only
// entry point callable from another thread).
#include "transport/shm/shm_transport.h"

#include <errno.h>
#include <sched.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/env.h"
#include "base/log.h"
#include "base/stall.h"
#include "bootstrap/socket.h"

namespace harp::transport::shm {

namespace {
char hexdigit(int v) { return "0123456789abcdef"[v & 15]; }
std::string hex64(uint64_t v) {
  std::string s = "0x";
  for (int i = 60; i >= 0; i -= 4) s += hexdigit(static_cast<int>(v >> i));
  return s;
}
}  // namespace

// ---- Pair ------------------------------------------------------------------

std::string ShmPair::who() const { return t_->rankName(peer_); }

void ShmPair::isend(Request* r) {
  r->state = Request::kPending;
  r->offset = 0;
  r->tp_word = 0;
  if (t_->aborted_.load(std::memory_order_acquire) && !t_->abort_handled_) t_->handleAbort();
  if (failed_) return r->fail(Request::kPeerFailure, failed_why_);
  if (dead_) return r->fail(Request::kPeerFailure, dead_why_);
  sends_.push_back(r);
  if (sends_.size() == 1) progressSends();  // eager: most small sends finish here
}

void ShmPair::irecv(Request* r) {
  r->state = Request::kPending;
  r->offset = 0;
  r->tp_word = 0;
  if (t_->aborted_.load(std::memory_order_acquire) && !t_->abort_handled_) t_->handleAbort();
  if (failed_) return r->fail(Request::kPeerFailure, failed_why_);
  recvs_.push_back(r);
  if (recvs_.size() == 1) progressRecvs();
}

// ---- What the peer writes: read once, checked (shm_transport.h) ---------------

namespace {
const char* kindName(uint32_t k) { return k == kMsg ? "message" : k == kCont ? "continuation" : "single-copy"; }
}  // namespace

std::string checkSlot(const SlotView& h, const SlotExpect& e, size_t cap) {
  auto n = [](uint64_t v) { return std::to_string(v); };
  if (h.kind != kMsg && h.kind != kCont && h.kind != kCma) return "a slot of unknown kind " + n(h.kind);
  if (!e.start) {
    const uint64_t left = e.len - e.done;
    if (h.kind != kCont)
      return std::string("a new ") + kindName(h.kind) + " slot in the middle of a message (tag " + hex64(e.tag) +
             ", " + n(e.len) + " bytes, " + n(e.done) + " received)";
    if (h.tag != e.tag || h.len != e.len)
      return "a continuation slot of tag " + hex64(h.tag) + ", " + n(h.len) + " bytes in the middle of a message (tag " +
             hex64(e.tag) + ", " + n(e.len) + " bytes)";
    if (h.nbytes == 0 || h.nbytes > std::min<uint64_t>(cap, left))
      return "a continuation slot of " + n(h.nbytes) + " payload bytes where " + n(left) +
             " bytes of the message remain and a slot holds " + n(cap);
    return "";
  }
  if (h.kind == kCont) return "a continuation slot without a message start";
  if (h.kind == kCma) {
    if (!e.cma) return "a single-copy descriptor, but this rank offered it no single-copy reads";
    if (h.nbytes != sizeof(uint64_t)) return "a single-copy descriptor of " + n(h.nbytes) + " bytes (not 8)";
    if (h.len == 0) return "a single-copy descriptor for an empty message";
    return "";
  }
  if (h.nbytes > std::min<uint64_t>(cap, h.len))
    return "a message slot of " + n(h.nbytes) + " payload bytes for a message of " + n(h.len) +
           " bytes (a slot holds " + n(cap) + ")";
  return "";
}

// One read of each field (relaxed atomics: the compiler may not read again).
SlotView ShmPair::readSlot() const {
  SlotHdr* h = inSlot(rtail_);
  SlotView v;
  v.tag = __atomic_load_n(&h->tag, __ATOMIC_RELAXED);
  v.len = __atomic_load_n(&h->len, __ATOMIC_RELAXED);
  v.kind = __atomic_load_n(&h->kind, __ATOMIC_RELAXED);
  v.nbytes = __atomic_load_n(&h->nbytes, __ATOMIC_RELAXED);
  return v;
}

// The peer's count of our single-copy messages it has read; false (and the
// pair failed) when it went back or past what we posted.
bool ShmPair::readAcks(uint64_t* acks) {
  const uint64_t a = in_ctl_->acks.load(std::memory_order_acquire);
  if (a < acks_seen_ || a > cma_posted_) {
    protocolError("it acknowledged " + std::to_string(a) + " single-copy messages (before: " +
                  std::to_string(acks_seen_) + "; this rank posted " + std::to_string(cma_posted_) + ")");
    return false;
  }
  *acks = acks_seen_ = a;
  return true;
}

void ShmPair::protocolError(const std::string& what) {
  if (failed_) return;
  const std::string why = "shm protocol error from " + who() + ": " + what + " (the pair with it is closed)";
  HARP_WARN("%s", why.c_str());
  failed_ = true;
  failed_why_ = why;
  discard_ = 0;
  failAll(Request::kPeerFailure, why);
}

// ---- Sending -----------------------------------------------------------------

bool ShmPair::hasFreeSlot() {
  if (head_ - tail_cache_ < nslots_) return true;
  const uint64_t tail = out_ctl_->tail.load(std::memory_order_acquire);
  if (tail < tail_cache_ || tail > head_) {  // progressSends reports it
    bad_tail_ = true;
    bad_tail_value_ = tail;
    return false;
  }
  tail_cache_ = tail;
  return head_ - tail_cache_ < nslots_;
}

void ShmPair::publish(SlotHdr* h, uint64_t k) { h->seq.store(k + 1, std::memory_order_release); }

bool ShmPair::progressSends() {
  bool moved = false;
  if (failed_) return false;
  if (!cma_wait_.empty()) {
    uint64_t acks;
    if (!readAcks(&acks)) return true;
    while (!cma_wait_.empty() && cma_wait_.front()->tp_word <= acks) {
      cma_wait_.front()->complete();
      cma_wait_.pop_front();
      moved = true;
    }
  }
  const size_t cap = slot_bytes_ - sizeof(SlotHdr);
  bool published = false;
  while (!sends_.empty()) {
    Request* r = sends_.front();
    if (cma_ && r->len > t_->cma_threshold_) {
      if (!hasFreeSlot()) break;
      SlotHdr* h = outSlot(head_);
      h->tag = r->tag;
      h->len = r->len;
      h->kind = kCma;
      h->nbytes = sizeof(uint64_t);
      uint64_t addr = reinterpret_cast<uint64_t>(r->buf);
      memcpy(payload(h), &addr, sizeof addr);
      publish(h, head_++);
      published = true;
      r->tp_word = ++cma_posted_;
      cma_wait_.push_back(r);
      sends_.pop_front();
      moved = true;
      continue;
    }
    bool full = false;
    do {
      if (!hasFreeSlot()) {
        full = true;
        break;
      }
      size_t n = std::min(cap, r->len - r->offset);
      SlotHdr* h = outSlot(head_);
      h->tag = r->tag;
      h->len = r->len;
      h->kind = r->offset == 0 ? kMsg : kCont;
      h->nbytes = static_cast<uint32_t>(n);
      if (n) memcpy(payload(h), static_cast<const char*>(r->buf) + r->offset, n);
      publish(h, head_++);
      published = true;
      r->offset += n;
      moved = true;
    } while (r->offset < r->len);
    if (full) break;
    r->complete();
    sends_.pop_front();
  }
  if (published) wakeIfSleeping(peer_hdr_);
  if (bad_tail_) {
    protocolError("its ring's consumed count went to " + std::to_string(bad_tail_value_) + " (before: " +
                  std::to_string(tail_cache_) + "; this rank wrote " + std::to_string(head_) + " slots)");
    return true;
  }
  return moved;
}

// ---- Receiving ---------------------------------------------------------------

void ShmPair::releaseSlot() { in_ctl_->tail.store(++rtail_, std::memory_order_release); }

// Skip the remaining slots of a message whose receive failed (mismatch).
bool ShmPair::drainDiscard() {
  bool moved = false;
  const size_t cap = slot_bytes_ - sizeof(SlotHdr);
  while (discard_ && !failed_ && slotReady()) {
    const SlotView h = readSlot();
    SlotExpect e;
    e.start = false;
    e.tag = discard_tag_;
    e.len = discard_len_;
    e.done = discard_len_ - discard_;
    std::string bad = checkSlot(h, e, cap);
    if (!bad.empty()) {
      protocolError(bad);
      return true;
    }
    discard_ -= h.nbytes;
    releaseSlot();
    moved = true;
  }
  return moved;
}

// Read the next piece of a single-copy message straight from the sender (its
// address cma_addr_ was read once and checked when the message started).
// False when the request failed.
bool ShmPair::readCma(Request* r) {
  size_t n = std::min(t_->cma_piece_, r->len - r->offset);
  iovec l{static_cast<char*>(r->buf) + r->offset, n};
  iovec rem{reinterpret_cast<void*>(cma_addr_ + r->offset), n};
  ssize_t k = process_vm_readv(pid_, &l, 1, &rem, 1, 0);
  if (k > 0) {
    r->offset += static_cast<size_t>(k);
    return true;
  }
  if (k < 0 && errno == EINTR) return true;
  int e = k == 0 ? EFAULT : errno;
  std::string why = e == ESRCH ? who() + " died (process_vm_readv: no such process)"
                               : "reading the send buffer of " + who() + " with process_vm_readv failed: " +
                                     std::strerror(e);
  markDead(why);
  failed_ = true;
  failed_why_ = why;
  failAll(Request::kPeerFailure, why);
  return false;
}

bool ShmPair::progressRecvs() {
  bool moved = false;
  if (discard_) moved |= drainDiscard();
  const size_t cap = slot_bytes_ - sizeof(SlotHdr);
  while (!recvs_.empty() && !discard_ && !failed_) {
    if (!slotReady()) {
      if (dead_) failAll(Request::kPeerFailure, dead_why_);
      break;
    }
    Request* r = recvs_.front();
    if (r->tp_word == 0) {  // the next slot: its header, read once and checked
      const SlotView h = readSlot();
      SlotExpect e;
      e.start = r->offset == 0;
      e.tag = r->tag;
      e.len = r->len;
      e.done = r->offset;
      e.cma = cma_in_;
      std::string bad = checkSlot(h, e, cap);
      if (!bad.empty()) {
        protocolError(bad);
        break;
      }
      if (e.start && (h.tag != r->tag || h.len != r->len)) {
        r->peer_tag = h.tag;
        r->peer_len = h.len;
        r->fail(Request::kMismatch, "message from " + who() + " has tag " + hex64(h.tag) + " and " +
                                        std::to_string(h.len) + " bytes; this rank expected tag " +
                                        hex64(r->tag) + " and " + std::to_string(r->len) + " bytes");
        recvs_.pop_front();
        if (h.kind == kCma) {
          out_ctl_->acks.store(++cma_acked_, std::memory_order_release);
          wakeIfSleeping(peer_hdr_);
        } else {
          discard_ = h.len - h.nbytes;  // checkSlot: nbytes <= len
          discard_tag_ = h.tag;
          discard_len_ = h.len;
        }
        releaseSlot();
        moved = true;
        if (discard_) drainDiscard();
        continue;
      }
      if (h.kind == kCma) {
        const uint64_t addr = __atomic_load_n(reinterpret_cast<const uint64_t*>(payload(inSlot(rtail_))),
                                              __ATOMIC_RELAXED);
        if (addr > UINT64_MAX - r->len) {
          protocolError("a single-copy descriptor at address " + hex64(addr) + " for " + std::to_string(r->len) +
                        " bytes (past the end of the address space)");
          break;
        }
        cma_addr_ = addr;
        r->tp_word = 1;  // started: the next calls continue the read
      } else {
        if (h.nbytes) memcpy(static_cast<char*>(r->buf) + r->offset, payload(inSlot(rtail_)), h.nbytes);
        r->offset += h.nbytes;
        releaseSlot();
        moved = true;
        if (r->offset >= r->len) {
          r->complete();
          recvs_.pop_front();
        }
        continue;
      }
    }
    if (!readCma(r)) break;
    moved = true;
    if (r->offset < r->len) break;  // next piece on the next progress call
    releaseSlot();
    out_ctl_->acks.store(++cma_acked_, std::memory_order_release);
    wakeIfSleeping(peer_hdr_);
    r->complete();
    recvs_.pop_front();
  }
  if (moved) wakeIfSleeping(peer_hdr_);  // it may wait for ring space
  return moved;
}

void ShmPair::failAll(Request::Failure f, const std::string& why) {
  for (Request* r : sends_) r->fail(f, why);
  for (Request* r : cma_wait_) r->fail(f, why);
  for (Request* r : recvs_) r->fail(f, why);
  sends_.clear();
  cma_wait_.clear();
  recvs_.clear();
}

void ShmPair::markDead(const std::string& why) {
  if (dead_) return;
  dead_ = true;
  dead_why_ = why;
  // A peer that aborted and then exited: its notice says more than the EOF.
  if (in_ctl_ && in_ctl_->abort.load(std::memory_order_acquire)) {
    char reason[sizeof(in_ctl_->reason) + 1];
    memcpy(reason, in_ctl_->reason, sizeof in_ctl_->reason);
    reason[sizeof in_ctl_->reason] = '\0';
    dead_why_ = who() + " aborted the communicator: " + reason;
  }
  HARP_INFO_S(LogSubsys::kShm, "shm: %s", why.c_str());
  // Single-copy sends the peer finished reading before it went away succeeded.
  uint64_t acks = 0;
  if (!readAcks(&acks)) return;  // failed every request
  while (!cma_wait_.empty() && cma_wait_.front()->tp_word <= acks) {
    cma_wait_.front()->complete();
    cma_wait_.pop_front();
  }
  // Nobody will read what we send any more; what the peer sent before it went
  // away is still in our ring and is delivered first (progressRecvs).
  for (Request* r : sends_) r->fail(Request::kPeerFailure, why);
  for (Request* r : cma_wait_) r->fail(Request::kPeerFailure, why);
  sends_.clear();
  cma_wait_.clear();
}

// ---- Transport ---------------------------------------------------------------

void ShmTransport::handleAbort() {
  std::string why;
  {
    std::lock_guard<std::mutex> g(abort_mu_);
    why = abort_why_;
  }
  abort_handled_ = true;
  for (ShmPair* p : active_) {
    p->failed_ = true;
    p->failed_why_ = "communicator aborted: " + why;
    p->failAll(Request::kPeerFailure, p->failed_why_);
  }
}

bool ShmTransport::progress() {
  if (aborted_.load(std::memory_order_acquire) && !abort_handled_) handleAbort();
  if ((++poll_counter_ & 1023) == 0) checkSockets();
  bool moved = false;
  for (ShmPair* p : active_) {
    if (p->in_ctl_->abort.load(std::memory_order_acquire) && !p->failed_ && !p->dead_) {
      // Like a peer that went away: what it sent before its notice is still
      // delivered (it may have completed that collective), then receives fail.
      char reason[sizeof(p->in_ctl_->reason) + 1];
      memcpy(reason, p->in_ctl_->reason, sizeof p->in_ctl_->reason);
      reason[sizeof p->in_ctl_->reason] = '\0';
      p->markDead(rankName(p->peer_) + " aborted the communicator: " + reason);
      moved = true;
    }
    if (!p->sends_.empty() || !p->cma_wait_.empty()) moved |= p->progressSends();
    if (!p->recvs_.empty() || p->discard_) moved |= p->progressRecvs();
  }
  return moved;
}

// Would progress() find something to do? (No side effects.)
bool ShmTransport::anythingReady() {
  if (aborted_.load(std::memory_order_acquire) && !abort_handled_) return true;
  for (ShmPair* p : active_) {
    if (p->in_ctl_->abort.load(std::memory_order_acquire) && !p->failed_ && !p->dead_) return true;
    if ((!p->recvs_.empty() || p->discard_) && (p->slotReady() || p->dead_)) return true;
    if (!p->sends_.empty() && p->hasFreeSlot()) return true;
    if (!p->cma_wait_.empty() && p->in_ctl_->acks.load(std::memory_order_acquire) >= p->cma_wait_.front()->tp_word)
      return true;
  }
  return false;
}

void ShmTransport::wait(int timeout_ms) {
  checkSockets();
  // Poll with sched_yield first (HARP_SHM_YIELD_US): when ranks outnumber
  // cores this hands the CPU to the rank we wait for and wakes up far faster
  // than a futex round trip through the scheduler; then block.
  if (yield_ns_ > 0 && timeout_ms > 0) {
    const auto t0 = Clock::now();
    const long limit = std::min<long>(yield_ns_, static_cast<long>(timeout_ms) * 1000000L);
    for (unsigned it = 1;; ++it) {
      if (anythingReady()) return;
      sched_yield();
      if ((it & 15) == 0 &&
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count() >= limit)
        break;
    }
  }
  SegHeader* h = seg_.header();
  uint32_t d = h->doorbell.load(std::memory_order_acquire);
  h->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Sleep in slices so a peer killed while we sleep is noticed (socket EOF).
  if (!anythingReady() && timeout_ms > 0) futexWait(&h->doorbell, d, std::min(timeout_ms, 100));
  h->sleeping.store(0, std::memory_order_relaxed);
  checkSockets();
}

void ShmTransport::abort(const std::string& why) {
  std::lock_guard<std::mutex> g(abort_mu_);
  if (aborted_.load()) return;
  abort_why_ = why;
  for (ShmPair* p : active_) {
    if (!p->out_ctl_) continue;
    size_t n = std::min(why.size(), sizeof(p->out_ctl_->reason) - 1);
    memcpy(p->out_ctl_->reason, why.data(), n);
    p->out_ctl_->reason[n] = '\0';
    p->out_ctl_->abort.store(1, std::memory_order_release);
    wakeIfSleeping(p->peer_hdr_);
  }
  aborted_.store(true, std::memory_order_release);
  SegHeader* h = seg_.header();
  h->doorbell.fetch_add(1);
  futexWakeAll(&h->doorbell);
}

// One load per peer of a line in this rank's own segment (written by the peer
// only when it aborts).
std::string ShmTransport::abortNotice() {
  for (ShmPair* p : active_) {
    if (!p->in_ctl_->abort.load(std::memory_order_acquire)) continue;
    char reason[sizeof(p->in_ctl_->reason) + 1];
    memcpy(reason, p->in_ctl_->reason, sizeof p->in_ctl_->reason);
    reason[sizeof p->in_ctl_->reason] = '\0';
    return rankName(p->peer_) + " aborted the communicator: " + reason;
  }
  return "";
}

// ---- Intra-host collective support ----------------------------------------------

const Transport::Capability ShmTransport::kCapability{"shm collective area"};

bool ShmTransport::coversCommunicator() const {
  return geo_.coll_chunk > 0 && static_cast<int>(active_.size()) == info_.size - 1;
}

CollFlags* ShmTransport::collFlags(int rank) const {
  if (rank == info_.rank) return seg_.collFlags();
  return pairs_[rank]->seg_.collFlags();
}

uint8_t* ShmTransport::collBuf(int rank, int b) const {
  if (rank == info_.rank) return seg_.collBuf(b);
  return pairs_[rank]->seg_.collBuf(b);
}

void ShmTransport::wakeRank(int rank) {
  if (rank != info_.rank && pairs_[rank]) wakeIfSleeping(pairs_[rank]->peer_hdr_);
}

void ShmTransport::wakeAll() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (ShmPair* p : active_)
    if (p->peer_hdr_->sleeping.load(std::memory_order_relaxed)) {
      p->peer_hdr_->doorbell.fetch_add(1);
      futexWakeAll(&p->peer_hdr_->doorbell);
    }
}

void ShmTransport::waitFor(const std::function<bool()>& cond, double timeout_s, const char* what,
                           const std::function<std::string()>& timeout_msg) {
  if (cond()) return;
  Deadline dl = Deadline::after(timeout_s);
  // Throws on an abort, a dead peer or a stray message; true when the
  // condition turned out to hold after all (the caller returns).
  auto failIfBroken = [&]() -> bool {
    if (check_delay_ns_ > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(check_delay_ns_));  // test hook
    if (aborted_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> g(abort_mu_);
      throw Error(Error::kPeerFailure, "communicator aborted: " + abort_why_);
    }
    for (ShmPair* p : active_) {
      if (p->in_ctl_->abort.load(std::memory_order_acquire)) {
        char reason[sizeof(p->in_ctl_->reason) + 1];
        memcpy(reason, p->in_ctl_->reason, sizeof p->in_ctl_->reason);
        reason[sizeof p->in_ctl_->reason] = '\0';
        throw Error(strstr(reason, "collective mismatch") ? Error::kMismatch : Error::kPeerFailure,
                    rankName(p->peer_) + " aborted the communicator: " + reason);
      }
      if (p->failed_) throw Error(Error::kPeerFailure, p->failed_why_);
      if (p->dead_) throw Error(Error::kPeerFailure, p->dead_why_);
      if (p->recvs_.empty() && !p->discard_ && p->slotReady()) {
        // A peer that saw this collective complete may already be in the next
        // one and have sent for it (it saw every flag we wait for, so they are
        // visible here now too): then the condition holds, and the message waits.
        if (cond()) return true;
        const SlotHdr* h = p->inSlot(p->rtail_);
        throw Error(Error::kMismatch, rankName(p->peer_) + " sent a message (tag " + hex64(h->tag) + ", " +
                                          std::to_string(h->len) + " bytes) while this rank runs " +
                                          std::string(what) +
                                          ": collective mismatch (the ranks are running different collectives)");
      }
    }
    return false;
  };
  // Spin (pause) for spin_us, then poll with sched_yield until yield_us, then
  // sleep on the doorbell. Yielding keeps latency low when ranks outnumber
  // cores (the rank we wait for gets the CPU); sleeping stops the burn when a
  // peer is slow for long.
  const long spin_ns = spin_ns_, yield_ns = yield_ns_;
  SegHeader* h = seg_.header();
  const auto t0 = Clock::now();
  stall::Watch watch(info_.comm_id, info_.rank, timeout_s);
  const int burst = std::min(16, inline_polls_);
  for (unsigned it = 1;; ++it) {
    for (int i = 0; i < burst; ++i) {
      if (cond()) return;
      cpuRelax();
    }
    long ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    if (ns < spin_ns) continue;
    if (ns < yield_ns) {
      sched_yield();
      if ((it & 255) == 0) {
        checkSockets();
        if (cond() || failIfBroken()) return;
      }
      continue;
    }
    // cond() again first: a peer that saw the condition complete may already
    // have failed on what follows (a collective mismatch) and aborted; this
    // rank must then see the condition too and report the same error itself.
    if (cond() || failIfBroken()) return;
    if (dl.passed()) throw Error(Error::kTimeout, timeout_msg());
    // Stall warning (base/stall.h): nothing before kMinStallS.
    watch.tick(ns * 1e-9, [&] {
      std::string m = timeout_msg();
      size_t at = m.find("waiting for rank(s) ");
      return at == std::string::npos ? std::string("?") : m.substr(at + 20, m.find(" (", at + 20) - at - 20);
    });
    uint32_t d = h->doorbell.load(std::memory_order_acquire);
    h->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!cond()) futexWait(&h->doorbell, d, std::max(1, std::min(100, dl.remainingMs())));
    h->sleeping.store(0, std::memory_order_relaxed);
    checkSockets();
  }
}

}  // namespace harp::transport::shm
