// core/engine/pipeline.cc — the stages of one call (core/engine/pipeline.h):
// choose, describe, run, finish, and the entry that orders them.
#include "core/engine/pipeline.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "base/log.h"
#include "base/reduce.h"
#include "core/algorithms/registry.h"
#include "core/engine/communicator.h"
#include "core/engine/context.h"
#include "core/observe/recorder.h"
#include "core/select/select.h"

namespace harp {
namespace {

size_t bytesOf(const CollArgs& a) { return a.count * dtypeSize(a.dtype); }

// A 62-bit hash of the pieces' counts, with bit 62 set (>= 4096, so the
// collective's tag never carries it exactly and the full descriptor check runs).
int64_t layoutHash(const std::vector<BufPiece>& pieces) {
  uint64_t h = 1469598103934665603ull ^ pieces.size();  // FNV-1a over the counts
  for (const BufPiece& b : pieces) {
    for (int k = 0; k < 8; ++k) {
      h ^= (b.count >> (8 * k)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>((h & ((1ull << 62) - 1)) | (1ull << 62));
}

SelectQuery queryOf(const CollArgs& a, int ranks, const std::string& transport, const Topology& topo, bool hier) {
  SelectQuery q;
  q.coll = a.coll;
  q.count = a.count;
  q.bytes = bytesOf(a);
  q.ranks = ranks;
  q.transport = transport;
  q.in_place = a.sendbuf && a.sendbuf == a.recvbuf;
  q.op = a.op;
  q.user_algo = a.opts.algo;
  q.hosts = topo.hosts;  // Topology
  q.min_local = topo.min_local;
  q.max_local = topo.max_local;
  q.blocked = topo.blocked;
  q.hier_auto = hier;
  q.link_flows = a.opts.link_flows;
  return q;
}

bool isSigned(DataType t) { return t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64; }
// The descriptor messages a rooted collective's data makes redundant
// (core/engine/context.h, CheckShape): only with an exact tag and data on this
// communicator's own pairs (not a hierarchical algorithm's sub-communicators),
// and only the shape the algorithm declares its message pattern safe for
// (AlgorithmSpec::root_check). Reduce and tree gathers keep the full exchange:
// their data reaches the root through inner ranks.
Context::CheckShape checkShape(const CollArgs& a, const Descriptor& d, const Algorithm& algo) {
  if (a.count == 0 || !tagIsExact(d.root, d.count) || algo.hier_cost) return Context::CheckShape::kAll;
  if ((a.coll == CollType::kBroadcast || a.coll == CollType::kScatter) && algo.root_check == RootCheck::kFromRoot)
    return Context::CheckShape::kFromRoot;
  if (a.coll == CollType::kGather && algo.root_check == RootCheck::kToRoot) return Context::CheckShape::kToRoot;
  return Context::CheckShape::kAll;
}
// This rank does not wait for its peers' descriptors in this rooted call
// (core/engine/context.h): it only sends data (the broadcast and scatter root, the
// reduce and gather non-roots; a reduce's inner ranks do receive, and their
// data's tags are compared in the call), or (kFromRoot) it receives data that
// vouches for the root and compares the descriptors that came while it waited.
bool defersCheck(const CollArgs& a, int rank, Context::CheckShape shape) {
  if (a.count == 0) return false;  // checked before the algorithm, in the call
  if (a.coll == CollType::kBroadcast || a.coll == CollType::kScatter)
    return a.root == rank || shape == Context::CheckShape::kFromRoot;
  return (a.coll == CollType::kReduce || a.coll == CollType::kGather) && a.root != rank;
}
}  // namespace

// ---------------------------------------------------------------------------
// validate (its run-time half) and the entry

// The entry: a broken communicator refuses the call (the run-time half of
// validate), integer avg detours through runIntAvg, the rest runs the stages.
void Communicator::runCollective(CollArgs& a) {
  if (broken_.load()) {
    std::lock_guard<std::mutex> g(broken_mu_);
    throw Error(broken_kind_, broken_reason_);
  }
  if (a.op == ReduceOp::kAvg && collReduces(a.coll) && isInteger(a.dtype) && size_ > 1) return runIntAvg(a);
  runStages(a, a.dtype);
}

// The stages in order; `a` runs as is, the tag and descriptor name
// `user_dtype` (runIntAvg runs widened data under the caller's dtype, so
// disagreements stay visible).
void Communicator::runStages(CollArgs& a, DataType user_dtype) {
  CallPlan plan(a, user_dtype, a.opts.timeout_s > 0 ? a.opts.timeout_s : timeout_s_);
  choose(plan);
  describe(plan);
  obs::OpScope recorded(recorder_.get(), a, plan.algo, user_dtype, plan.p2p ? 0 : plan.desc.seq);  // flight recorder
  runPlan(plan, recorded);
  finish(plan);
}

// ---------------------------------------------------------------------------
// choose

std::string Communicator::chooseAlgorithm(const CollArgs& a) const {
  return selectAlgorithm(queryOf(a, size_, transport_kind_, topo_, hier_auto_), tuning_, calibration_, false).pick->name;
}

std::string Communicator::lastAlgorithm(CollType c) {
  std::lock_guard<std::mutex> ex(exec_mu_);
  const size_t slot = static_cast<size_t>(c);
  return slot < std::size(algo_memo_) && algo_memo_[slot].algo ? algo_memo_[slot].algo->name : "";
}

const Algorithm* Communicator::algorithmFor(const CollArgs& a) {
  const SelectQuery q = queryOf(a, size_, transport_kind_, topo_, hier_auto_);
  const size_t slot = static_cast<size_t>(a.coll);
  const bool memo = a.opts.algo.empty() && slot < std::size(algo_memo_);
  if (memo && algo_memo_[slot].algo && algo_memo_[slot].bytes == q.bytes && algo_memo_[slot].in_place == q.in_place &&
      algo_memo_[slot].link_flows == q.link_flows)
    return algo_memo_[slot].algo;
  const Selection sel = selectAlgorithm(q, tuning_, calibration_, false);
  const bool fell_back = !sel.named_failed.empty() && sel.source == PickSource::kUser;
  if (fell_back || logLevel() >= LogLevel::kInfo) {
    std::string key = std::string(collName(a.coll)) + "/" + sel.pick->name + "/" + sel.why;
    if (std::find(logged_algos_.begin(), logged_algos_.end(), key) == logged_algos_.end()) {
      logged_algos_.push_back(key);
      if (fell_back)
        HARP_WARN("%s: %s (%zu bytes, %d ranks)", collName(a.coll), sel.reason().c_str(), q.bytes, size_);
      else
        HARP_INFO_S(LogSubsys::kTuning, "%s: algorithm %s (%zu bytes, %d ranks): %s", collName(a.coll), sel.pick->name, q.bytes, size_,
                  sel.reason().c_str());
    }
  }
  if (memo) algo_memo_[slot] = {q.bytes, q.in_place, q.link_flows, sel.pick};
  return sel.pick;
}

// Compression first: a compressed float32 allreduce runs its own algorithm,
// whose reserved index in the tag and descriptor keeps ranks that disagree
// apart (core/compress/compress.h). Then the selector.
inline void Communicator::choose(CallPlan& p) {
  CollArgs& a = p.args;
  p.algo = a.coll == CollType::kAllreduce && a.compress.kind != CompressKind::kNone ? compressedAlgorithm(a) : nullptr;
  if (!p.algo) p.algo = algorithmFor(a);
}

// ---------------------------------------------------------------------------
// describe

inline void Communicator::describe(CallPlan& p) {
  const CollArgs& a = p.args;
  p.p2p = a.coll == CollType::kSend || a.coll == CollType::kRecv || a.coll == CollType::kP2pBatch;
  p.rooted = collRooted(a.coll);
  if (p.p2p) {
    // send and recv share one tag kind; the full 32-bit user tag travels.
    p.tag = makeP2pTag(a.dtype, a.tag);
    return;
  }
  Descriptor& d = p.desc;
  d.seq = ++seq_;
  d.coll = static_cast<uint8_t>(a.coll);
  d.dtype = static_cast<uint8_t>(p.user_dtype);
  d.op = static_cast<uint8_t>(collReduces(a.coll) ? a.op : ReduceOp::kSum);
  d.algo = static_cast<uint8_t>(p.algo->index);
  d.root = p.rooted ? a.root : a.coll == CollType::kAllreduceCoalesced ? layoutHash(a.pieces) : 0;
  d.count = a.count;
  p.tag = makeTag(d.seq, a.coll, p.user_dtype, static_cast<ReduceOp>(d.op), static_cast<int>(d.root), d.count, d.algo);
  p.check = a.coll != CollType::kBarrier && !collVcounts(a.coll) && size_ > 1 &&
            (p.rooted || a.count == 0 || !tagIsExact(d.root, d.count));
}

// ---------------------------------------------------------------------------
// run

// Descriptor agreement. Every message's tag carries the descriptor (exact for
// root < 4096, count < 2^32), so a receiver finds a disagreement with its
// sender. That is not enough where a rank only sends (broadcast/scatter root,
// gather and reduce leaves) or where ranks disagree about the root (they
// then disagree about who talks to whom and may wait for messages nobody
// sends). Rooted collectives therefore run the exact descriptor check of
// Context::startCheck alongside the data (posted first, compared while
// waiting, completed at the end): every rank hears from every rank, directly
// or through data that only agreeing ranks forward (checkShape). A rank whose
// data disagrees raises MismatchError in the call; one that only sent, or
// whose data agreed (defersCheck), raises at a later call (by its next
// non-deferring call, HARP_CHECK_WINDOW calls, or destroy()). Cost: with an
// exact tag each broadcast/scatter receiver sends its 24-byte descriptor to its
// p-1 peers and nobody waits for one; ABBA figures against the tree before the
// check in bench/RESULTS.md ("Deferred root check"). Large messages unchanged.
// Allreduce pays only the closing check (closingCheck). Zero counts and
// descriptors the tag cannot carry run the check before the algorithm (a rank
// with count 0 would otherwise return before anyone could compare).
inline void Communicator::runPlan(CallPlan& p, obs::OpScope& recorded) {
  CollArgs& a = p.args;
  // The Context outlives the catch below: markBroken() fails the
  // transports' pending requests, which live in it (destroyed first, they were
  // freed memory the abort wrote to: "double free or corruption" in failAll).
  std::optional<Context> live;
  try {
    Context& ctx = live.emplace(res_, rank_, size_, a, p.tag, p.timeout);
    if (p.check) {
      // A copy: the plan's address never escapes, so the compiler keeps it in
      // registers (passing p.desc itself cost ~23 instructions a call, callgrind).
      const Descriptor d = p.desc;
      const Context::CheckShape shape = p.rooted ? checkShape(a, d, *p.algo) : Context::CheckShape::kAll;
      ctx.startCheck(d, shape, p.rooted && defersCheck(a, rank_, shape));
      if (!p.rooted || a.count == 0) ctx.finishCheck();
    }
    p.algo->fn(ctx);
    if (p.check) ctx.finishCheck();
    ctx.settleDeferred();  // an earlier call's, where this rank only sent
    if (!p.p2p) closingCheck(a, p.desc.seq, ctx.hearsFromAll());
    recorded.ok();
  } catch (const Error& e) {
    if (e.kind() == Error::kInvalidArgument) throw;
    failCall(e, live ? &*live : nullptr);
  }
}

// Fault tolerance: called from the run stage's handler (a bare `throw`
// rethrows the error as it was thrown); breaks the communicator on every rank
// and raises the error, explained where something explains it.
void Communicator::failCall(const Error& e, Context* ctx) {
  // An earlier call's deferred check that shows a disagreement explains this
  // failure (e.g. a peer's abort reached a shm allreduce's own wait first).
  const bool named = dynamic_cast<const DeferredCheckError*>(&e) != nullptr;  // thrown by the check itself
  const std::string earlier = ctx && !named ? ctx->deferredFinding() : std::string();
  if (!earlier.empty()) {
    std::string why = earlier + "; " + e.what();
    markBroken(why);
    throw Error(Error::kMismatch, why);
  }
  // A timeout (this rank's or a peer's) gains the op-count view
  // naming the ranks that never started this collective.
  std::string why = obs::withOpCounts(recorder_.get(), e.what());
  markBroken(why);
  // A transport's failure text quoting a revocation is a revocation
  if (e.kind() == Error::kPeerFailure && noticeKind(why) == Error::kRevoked) throw Error(Error::kRevoked, why);
  if (e.kind() == Error::kPeerFailure) {
    std::string dead = keepAliveVerdict(why);  // name the dead rank(s)
    if (!dead.empty()) throw Error(Error::kPeerFailure, why + "; " + dead);
  }
  if (why.size() == std::strlen(e.what())) throw;
  throw Error(e.kind(), why);
}

// A peer's abort notice that arrived while this collective ran (its data may
// all have come before it): the collective fails, like every later call.
// shm: one load per peer; tcp: one poll(2) per collective. Not where the call
// left a deferred check that hears from every peer (deferred): a peer that
// aborted before this call fails that check, raised at a later call.
void Communicator::closingCheck(const CollArgs& a, uint32_t seq, bool deferred) {
  for (auto& t : res_.transports) {
    if (deferred) break;
    std::string notice = t->abortNotice();
    if (notice.empty()) continue;
    // "after collective #N": the aborting rank had completed collective N.
    static const std::string kMark = "after collective #";
    size_t at = notice.find(kMark);
    if (at != std::string::npos && std::strtoull(notice.c_str() + at + kMark.size(), nullptr, 10) >= seq) continue;
    throw Error(noticeKind(notice), std::string(collName(a.coll)) + " on rank " + std::to_string(rank_) + " failed: " + notice);
  }
  // Completed here: record it, unless abort() came first (then it said the
  // last completed collective was the one before, so this one fails too).
  uint64_t w = done_word_.load(std::memory_order_acquire);
  do {
    if (w & 1) {
      std::lock_guard<std::mutex> g(broken_mu_);
      throw Error(broken_kind_, broken_reason_);
    }
  } while (!done_word_.compare_exchange_weak(w, static_cast<uint64_t>(seq) << 1, std::memory_order_acq_rel));
}

// ---------------------------------------------------------------------------
// finish

inline void Communicator::finish(CallPlan& p) {
  const CollArgs& a = p.args;
  res_.scratch.trim(res_.scratch_keep);  // no high-water mark above the cap (core/engine/scratch.h)
  // avg: every reducing collective's output is divided where this rank has one
  // (its receive extent, base/vocab.def: a reduce's off the root has none).
  if (a.op == ReduceOp::kAvg && !isInteger(a.dtype) && collReduces(a.coll)) {
    const Extent out = collRecv(a.coll);
    if (out == Extent::listed) {
      for (const BufPiece& b : a.pieces) finalizeAvg(b.recv, b.count, a.dtype, size_);
    } else if (const size_t blocks = bufferBlocks(out, size_, a.root == rank_); blocks > 0) {
      finalizeAvg(a.recvbuf, a.count * blocks, a.dtype, size_);
    }
  }
}

// ---------------------------------------------------------------------------
// integer avg: the validate stage's detour around the other four

// Integer avg without wrap-around: the sum of p values overflows the type
// long before the average does. 8- and 32-bit integers travel as 64-bit sums
// (|sum| <= p * 2^32, exact); 64-bit integers travel as (x div p, x mod p)
// pairs, whose sums fit, and the exact truncated average is put together at
// the end (wideAvgIn / wideAvgOut in core/reduce). Costs 2-8x the bytes of a
// plain sum and a copy in and out; only integer avg pays it.
void Communicator::runIntAvg(CollArgs& a) {
  const size_t n = a.count;
  const size_t w = wideAvgWidth(a.dtype);  // int64 words per element
  const bool rs = a.coll == CollType::kReduceScatter;
  const size_t blocks = rs ? static_cast<size_t>(size_) : 1;
  if (n > SIZE_MAX / 8 / w / blocks)
    throw InvalidArgument(std::string(collName(a.coll)) + ": count " + std::to_string(n) + " too large for avg");
  const bool want_out = a.coll != CollType::kReduce || a.root == rank_;
  // mmap'd (core/engine/scratch.h), unmapped on return: never a heap high-water mark
  Scratch in_block, out_block;
  auto* in = static_cast<int64_t*>(in_block.reserve(blocks * n * w * 8));
  auto* out = static_cast<int64_t*>(out_block.reserve(want_out ? n * w * 8 : 0));
  const size_t es = dtypeSize(a.dtype);
  for (size_t b = 0; b < blocks; ++b)
    wideAvgIn(in + b * n * w, static_cast<const char*>(a.sendbuf) + b * n * es, n, a.dtype, size_);
  CollArgs wide = a;
  wide.sendbuf = in;
  wide.recvbuf = want_out ? out : nullptr;
  wide.count = n * w;
  wide.dtype = isSigned(a.dtype) ? DataType::kInt64 : DataType::kUint64;
  runStages(wide, a.dtype);
  if (want_out) wideAvgOut(a.recvbuf, out, n, a.dtype, size_);
}

}  // namespace harp
