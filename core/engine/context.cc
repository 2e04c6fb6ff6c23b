#include "core/engine/context.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "base/env.h"
#include "base/log.h"
#include "core/engine/communicator.h"
#include "core/observe/recorder.h"

namespace harp {

namespace {
constexpr uint64_t kCheckColl = 0xf;

std::string descText(CollType c, uint64_t count, bool show_count, DataType dt, ReduceOp op, const std::string& root,
                     uint32_t seq) {
  std::string s = std::string(collName(c)) + "(";
  if (show_count) s += "count=" + std::to_string(count) + ", ";
  s += std::string("dtype=") + dtypeName(dt);
  switch (c) {
    case CollType::kAllreduce:
    case CollType::kReduceScatter:
      s += std::string(", op=") + opName(op);
      break;
    case CollType::kReduce:
      s += std::string(", op=") + opName(op) + ", root=" + root;
      break;
    case CollType::kBroadcast:
    case CollType::kGather:
    case CollType::kScatter:
      s += ", root=" + root;
      break;
    default:
      break;
  }
  return s + ") #" + std::to_string(seq);
}
}  // namespace

uint64_t makeTag(uint32_t seq, CollType c, DataType dt, ReduceOp op, int root, uint64_t count, unsigned algo) {
  return (static_cast<uint64_t>(seq & 0xf) << 60) | (static_cast<uint64_t>(algo & 0xf) << 56) |
         (static_cast<uint64_t>(c) & 0xf) << 52 | (static_cast<uint64_t>(dt) & 0xf) << 48 |
         (static_cast<uint64_t>(op) & 0xf) << 44 | (static_cast<uint64_t>(root) & 0xfff) << 32 |
         (count & 0xffffffffull);
}

// The check tag carries the whole call number (a window of deferred checks
// spans up to 64 calls).
uint64_t makeCheckTag(uint32_t seq) { return kCheckColl << 52 | seq; }

uint64_t makeP2pTag(DataType dt, uint32_t user_tag) {
  return (static_cast<uint64_t>(CollType::kSend) & 0xf) << 52 | (static_cast<uint64_t>(dt) & 0xf) << 48 | user_tag;
}

std::string describeTag(uint64_t tag) {
  const uint64_t coll = (tag >> 52) & 0xf;
  const uint32_t seq = static_cast<uint32_t>(tag >> 60);
  if (coll == kCheckColl) return "descriptor check #" + std::to_string(static_cast<uint32_t>(tag));
  auto c = static_cast<CollType>(coll);
  auto dt = static_cast<DataType>((tag >> 48) & 0xf);
  if (c == CollType::kSend || c == CollType::kRecv)
    return std::string("send/recv(dtype=") + dtypeName(dt) + ", tag=" + std::to_string(tag & 0xffffffffull) + ")";
  auto op = static_cast<ReduceOp>((tag >> 44) & 0xf);
  std::string root = std::to_string((tag >> 32) & 0xfff);
  return descText(c, tag & 0xffffffffull, true, dt, op, root, seq) + " algorithm #" + std::to_string((tag >> 56) & 0xf);
}

std::string describe(const Descriptor& d) {
  return descText(static_cast<CollType>(d.coll), d.count, static_cast<CollType>(d.coll) != CollType::kBarrier,
                  static_cast<DataType>(d.dtype), static_cast<ReduceOp>(d.op), std::to_string(d.root), d.seq) +
         " algorithm #" + std::to_string(d.algo);
}

Context::Context(CommResources& res, int rank, int size, const CollArgs& args, uint64_t tag, double timeout_s)
    : res_(res), args_(args), tag_(tag), timeout_s_(timeout_s), rank_(rank), size_(size),
      esize_(dtypeSize(args.dtype)), settle_n_(res.deferred_n) {}

Context::~Context() {
  if (!reqs_) return;
  for (Request& r : *reqs_) {
    if (r.done() || r.peer < 0 || r.peer >= static_cast<int>(res_.transport_of.size())) continue;
    if (transport::Transport* t = res_.transport_of[r.peer])
      t->abort("a collective on rank " + std::to_string(rank_) + " ended with requests still pending");
  }
}

Request* Context::isend(int peer, const void* buf, size_t bytes) { return isend(peer, buf, bytes, tag_); }

Request* Context::irecv(int peer, void* buf, size_t bytes) { return irecv(peer, buf, bytes, tag_); }

Request* Context::isend(int peer, const void* buf, size_t bytes, uint64_t tag, bool lazy) {
  Request& r = (reqs_ ? *reqs_ : reqs_.emplace()).emplace_back();
  r.buf = const_cast<void*>(buf);
  r.len = bytes;
  r.tag = tag;
  r.peer = peer;
  r.lazy = lazy;
  res_.pair_of[peer]->isend(&r);
  return &r;
}

Request* Context::irecv(int peer, void* buf, size_t bytes, uint64_t tag) {
  Request& r = (reqs_ ? *reqs_ : reqs_.emplace()).emplace_back();
  r.buf = buf;
  r.len = bytes;
  r.tag = tag;
  r.peer = peer;
  res_.pair_of[peer]->irecv(&r);
  return &r;
}

void Context::check(Request* r) {
  if (r->state != Request::kFailed) return;
  std::string op = describeTag(r->tag);
  if (r->failure == Request::kMismatch) {
    throw Error(Error::kMismatch, "collective mismatch between rank " + std::to_string(rank_) + " and rank " +
                                      std::to_string(r->peer) + ": rank " + std::to_string(rank_) + " called " +
                                      op + " expecting " + std::to_string(r->len) + " bytes, rank " +
                                      std::to_string(r->peer) + " sent " + describeTag(r->peer_tag) + " with " +
                                      std::to_string(r->peer_len) + " bytes");
  }
  // A peer that found a mismatch aborts with that text: keep the kind, so every
  // rank raises the same class of error.
  Error::Kind kind = noticeKind(r->error);  // mismatch, revoked or peer failure
  if (r->failure == Request::kLocal) kind = Error::kInvalidArgument;  // our own buffer, not the peer
  throw Error(kind, std::string(collName(args_.coll)) + " on rank " + std::to_string(rank_) + " failed: " + r->error);
}

void Context::wait(Request* r) { waitAll({r}); }

void Context::waitAll(std::initializer_list<Request*> rs) { waitAll(std::vector<Request*>(rs)); }

void Context::waitAll(const std::vector<Request*>& rs) {
  // A wait for many bytes lasts far longer than a wake-up: spinning then only
  // takes CPU from the peers and the kernel's network stack (HARP_SPIN_BYTES).
  size_t pending = 0;
  for (Request* r : rs) pending += r->len;
  const int kSpin = pending > res_.spin_bytes ? 1 : res_.spin;
  Deadline dl = Deadline::after(timeout_s_);
  int idle = 0;
  bool warned = false;  // stall warning given
  auto& transports = res_.transports;
  for (;;) {
    if (checksPending()) compareChecks();
    bool all = true;
    for (Request* r : rs) {
      if (!r->done()) all = false;
      else check(r);
    }
    if (all) return;
    bool moved = false;
    for (auto& t : transports) moved |= t->progress();
    if (moved) {
      idle = 0;
      continue;
    }
    ++idle;
    if (idle < kSpin) continue;
    if (idle < 2 * kSpin) {
      sched_yield();
      continue;
    }
    if (dl.passed()) {
      std::string peers;
      for (Request* r : rs)
        if (!r->done()) peers += (peers.empty() ? "" : ", ") + std::to_string(r->peer);
      throw Error(Error::kTimeout, describeTag(tag_) + " on rank " + std::to_string(rank_) + " timed out after " +
                                       formatSeconds(timeout_s_) +
                                       " s waiting for rank(s) " + peers +
                                       " (a rank is stuck, dead, or did not call this collective)");
    }
    // Stall warning: once per wait, only here on the blocking path.
    // Elapsed from the deadline (remainingMs caps at ~25 days: HARP_TIMEOUT=inf
    // would read as a stall at once).
    if (res_.recorder && !warned &&
        std::min(timeout_s_, kForeverS) - dl.remainingS() >= std::min(res_.stall_warning_s, timeout_s_ / 2)) {
      warned = true;
      std::string peers;
      for (Request* r : rs)
        if (!r->done()) peers += (peers.empty() ? "" : ", ") + std::to_string(r->peer);
      obs::stallCheck(res_.recorder, std::min(timeout_s_, kForeverS) - dl.remainingS(), peers);
    }
    // Block on the transport(s) that hold the pending requests.
    transport::Transport* only = nullptr;
    bool several = false;
    for (Request* r : rs) {
      if (r->done()) continue;
      transport::Transport* t = res_.transport_of[r->peer];
      if (only && t != only) several = true;
      only = t;
    }
    int slice = std::min(dl.remainingMs(), 200);
    if (several) {
      for (auto& t : transports) t->wait(0);
      sched_yield();
    } else if (only) {
      only->wait(std::max(slice, 1));
    }
    idle = 2 * kSpin;  // after a block: poll once, then block again
  }
}

void Context::sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes) {
  Request* s = isend(to, sbuf, sbytes);
  Request* r = irecv(from, rbuf, rbytes);
  waitAll({s, r});
}

transport::Transport* Context::transportOf(int peer) const { return res_.transport_of.at(peer); }

void* Context::scratch(size_t bytes) {
  return res_.scratch.reserve(bytes);
}

size_t Context::segmentBytes() const { return res_.segment_bytes; }

// Each rank uses its own idea of the root: ranks that disagree about it then
// disagree about which messages exist, and a tag mismatch (or a descriptor
// that says so) fails them.
void Context::startCheck(const Descriptor& mine, CheckShape shape, bool defer) {
  check_mine_ = &mine;
  const uint64_t tag = makeCheckTag(mine.seq);
  const int root = static_cast<int>(mine.root);
  const bool from = shape == CheckShape::kFromRoot, to = shape == CheckShape::kToRoot;
  check_recvs_.clear();
  check_done_ = 0;
  DeferredCheck* dc = nullptr;
  if (defer) {
    // settleDeferred() keeps at most check_window open between calls
    if (res_.deferred_n >= static_cast<int>(res_.deferred.size()))
      throw Error(Error::kInternal, "every deferred descriptor check slot is open");
    dc = &res_.deferred[(res_.deferred_head + res_.deferred_n++) % res_.deferred.size()];
    dc->mine = mine;
    dc->received = from && rank_ != root;
    if (dc->received) open_dc_ = dc;
    opened_ = true;
    dc->theirs.resize(size_);
    dc->compared.assign(size_, 0);
    dc->reqs.clear();
    dc->reqs.reserve(size_);  // no reallocation below: the transports keep these pointers
    // Every peer is heard from in this call (a descriptor from each, or the
    // root's data): a peer that aborted before it shows up as this call's
    // failed check, so the closing abort-notice poll adds nothing.
    hears_all_ = true;
  }
  auto& theirs = dc ? dc->theirs : res_.check_buf;
  theirs.resize(size_);
  if (!(to && rank_ == root))
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || (from && q == root)) continue;
      if (!dc) {
        check_recvs_.push_back(irecv(q, &theirs[q], sizeof(Descriptor), tag));
        continue;
      }
      Request& r = dc->reqs.emplace_back();
      r.buf = &theirs[q];
      r.len = sizeof(Descriptor);
      r.tag = tag;
      r.peer = q;
      r.lazy = true;  // read as the transport likes until someone waits for it (settleDeferred)
      res_.pair_of[q]->irecv(&r);
    }
  // A deferred check's descriptors are lazy sends (transport.h): nobody waits
  // for them in this call, so a transport may carry several calls' at once
  // (tcp: copied and held, up to kMaxLazyHeld per connection, written in one
  // sendmsg; pushed sooner by an unhinted send, a wait longer than 1 ms and
  // the keep-alive's beat). Only with a window of at least twice that: the
  // root's call k+window needs call k's, and receivers that keep up with it
  // have pushed them by then without waiting.
  check_sends_.clear();
  const bool lazy = dc != nullptr && res_.check_window >= 2 * transport::kMaxLazyHeld;
  if (!(from && rank_ == root))
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && !(to && q == root)) check_sends_.push_back(isend(q, &mine, sizeof(Descriptor), tag, lazy));
}

// Compare the peers' descriptors that have arrived, in order.
void Context::compareChecks() {
  while (check_done_ < check_recvs_.size() && check_recvs_[check_done_]->done()) {
    Request* r = check_recvs_[check_done_++];
    check(r);
    const Descriptor& d = res_.check_buf[r->peer];
    if (d == *check_mine_) continue;
    throw Error(Error::kMismatch, "collective mismatch between rank " + std::to_string(rank_) + " and rank " +
                                      std::to_string(r->peer) + ": rank " + std::to_string(rank_) + " called " +
                                      describe(*check_mine_) + ", rank " + std::to_string(r->peer) + " called " +
                                      describe(d));
  }
  // Earlier calls' deferred checks, oldest first; closed once they agree.
  while (settle_n_ > 0 && compareDeferred(res_.deferred[res_.deferred_head])) {
    res_.deferred_head = (res_.deferred_head + 1) % res_.deferred.size();
    --res_.deferred_n;
    --settle_n_;
  }
  // This call's own deferred receives, as far as they came: a receiver blocked
  // on data that a rank with another idea of the root never sends still raises.
  if (open_dc_)
    for (size_t i = 0; i < open_dc_->reqs.size(); ++i) {
      Request& r = open_dc_->reqs[i];
      if (open_dc_->compared[i] || !r.done()) continue;
      check(&r);
      open_dc_->compared[i] = 1;
      const Descriptor& d = open_dc_->theirs[r.peer];
      if (d == *check_mine_) continue;
      throw Error(Error::kMismatch, "collective mismatch between rank " + std::to_string(rank_) + " and rank " +
                                        std::to_string(r.peer) + ": rank " + std::to_string(rank_) + " called " +
                                        describe(*check_mine_) + ", rank " + std::to_string(r.peer) + " called " +
                                        describe(d));
    }
}

// One earlier call's deferred check: once every receive is done, or one
// failed, name every rank that disagreed (or, failing that, the failure).
// partial: raise for a disagreement among those that came, even if others
// have not (returns false while any is missing).
bool Context::compareDeferred(DeferredCheck& dc, bool partial) {
  bool all = true, failed = false, bad = false;
  for (size_t i = 0; i < dc.reqs.size(); ++i) {
    const Request& r = dc.reqs[i];
    all &= r.done();
    if (!r.done() || dc.compared[i]) continue;
    failed |= r.state == Request::kFailed;
    bad |= r.state == Request::kFailed || !(dc.theirs[r.peer] == dc.mine);
  }
  if (!bad) {
    if (!all) return false;
    return true;
  }
  if (!all && !failed && !partial) return false;
  std::string who, what, failure;
  Error::Kind kind = Error::kMismatch;
  for (const Request& r : dc.reqs) {
    if (!r.done()) continue;
    const std::string q = std::to_string(r.peer);
    if (r.state == Request::kFailed && r.failure == Request::kMismatch) {
      who += (who.empty() ? "" : ", ") + q;
      what += "; rank " + q + " sent " + describeTag(r.peer_tag) + " (" + std::to_string(r.peer_len) +
              " bytes) where its descriptor was due";
    } else if (r.state == Request::kFailed) {
      if (failure.empty()) {
        failure = "rank " + q + ": " + r.error;
        kind = noticeKind(r.error);
      }
    } else if (!(dc.theirs[r.peer] == dc.mine)) {
      who += (who.empty() ? "" : ", ") + q;
      what += "; rank " + q + " called " + describe(dc.theirs[r.peer]);
    }
  }
  const std::string call = "call #" + std::to_string(dc.mine.seq) + " (" + describe(dc.mine) + ")";
  if (!who.empty())
    throw DeferredCheckError(Error::kMismatch, "collective mismatch in rank " + std::to_string(rank_) + "'s earlier " + call +
                                      ", found at a later call: rank(s) " + who + " disagreed" + what +
                                      " (rank " + std::to_string(rank_) +
                                      (dc.received ? "'s data in that call agreed with its call, so it compares "
                                                     "the descriptors that had not come by that call's end"
                                                   : " only sent data in that call, so it compares its peers' descriptors") +
                                      " at its later calls on the communicator, by HARP_CHECK_WINDOW calls or "
                                      "at destroy())");
  if (partial && !all) return false;  // nothing found yet among those that came
  throw DeferredCheckError(kind, "the descriptor check of rank " + std::to_string(rank_) + "'s earlier " + call +
                        " failed: " + failure);
}

// At a call's end: earlier calls' deferred checks. A call that did not defer
// its own check waits for all of them; one that did waits only for the oldest
// beyond check_window (so back-to-back rooted calls pipeline that deep). What
// has come of the others is compared now.
void Context::settleDeferred() {
  if (settle_n_ == 0) return;
  const size_t ring = res_.deferred.size();
  const int must = opened_ ? std::max(0, settle_n_ + 1 - res_.check_window) : settle_n_;
  bool pending = false;
  for (int i = 0; i < must; ++i)
    for (const Request& r : res_.deferred[(res_.deferred_head + i) % ring].reqs) pending |= !r.done();
  if (pending) {
    std::vector<Request*> rs;
    for (int i = 0; i < must; ++i)
      for (Request& r : res_.deferred[(res_.deferred_head + i) % ring].reqs) {
        r.lazy = false;  // waited for now: the transports read it eagerly
        rs.push_back(&r);
      }
    waitAll(rs);  // compareChecks, at the top of each round, throws before check() would
  }
  compareChecks();
  for (int i = 0; i < settle_n_; ++i) compareDeferred(res_.deferred[(res_.deferred_head + i) % ring], true);
}

std::string Context::deferredFinding() {
  if (settle_n_ == 0) return "";
  try {
    for (auto& t : res_.transports) t->progress();
    compareChecks();
    for (int i = 0; i < settle_n_; ++i)
      compareDeferred(res_.deferred[(res_.deferred_head + i) % res_.deferred.size()], true);
  } catch (const DeferredCheckError& e) {
    if (e.kind() == Error::kMismatch) return e.what();
  } catch (const std::exception&) {
  }
  return "";
}

void Context::finishCheck() {
  waitAll(check_recvs_);
  compareChecks();
  waitAll(check_sends_);
}

// Topology
SubComms& Context::subComms() {
  if (!res_.owner) throw Error(Error::kInternal, "this collective has no communicator to make sub-communicators of");
  return res_.owner->subComms();
}

}  // namespace harp
