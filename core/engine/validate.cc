// core/engine/validate.cc — the validate stage of a call (core/engine/pipeline.h):
// a collective's arguments checked alone on the submitting thread, before
// anything is sent, so an InvalidArgument names the argument and leaves the
// communicator usable. The messages are part of the interface (tests match them).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/engine/communicator.h"

namespace harp {
namespace {

std::string span(const void* p, size_t n) {
  char b[64];
  snprintf(b, sizeof b, "[%p, +%zu bytes)", p, n);
  return b;
}

// Each collective's byte and in-place rules (vocab.def, base/types.h) as a table made at compile
// time, so a call reads two bytes instead of walking the accessors: blocks of `count` each
// buffer holds on the root ([1]) and elsewhere ([0]), as 0, 1 or kP (p blocks).
constexpr uint8_t kP = 2;
struct BufShape {
  uint8_t send[2], recv[2];
  InPlaceRule rule;
};
constexpr std::array<BufShape, kNumCollTypes> kShapes = [] {
  std::array<BufShape, kNumCollTypes> t{};
  for (int i = 0; i < kNumCollTypes; ++i) {
    const auto c = static_cast<CollType>(i);
    for (int r = 0; r < 2; ++r) {
      t[i].send[r] = static_cast<uint8_t>(bufferBlocks(collSend(c), kP, r));
      t[i].recv[r] = static_cast<uint8_t>(bufferBlocks(collRecv(c), kP, r));
    }
    t[i].rule = collInPlace(c);
  }
  return t;
}();
static_assert(kShapes[static_cast<int>(CollType::kReduceScatter)].send[0] == kP &&
              kShapes[static_cast<int>(CollType::kGather)].recv[0] == 0);
// Bytes of a buffer of `blocks` (kShapes) blocks of `blk` bytes at p ranks.
inline size_t shapeBytes(uint8_t blocks, size_t blk, size_t p) { return blocks == kP ? blk * p : blk * blocks; }

// Send and receive ranges of one collective must be disjoint, or the receive
// range must start exactly where the collective's in-place rule (vocab.def's
// inplace column, collInPlace) puts it: at the send buffer (`same`), or at
// block `r` of a p-block send buffer (`block`, reduce_scatter / scatter:
// NCCL's in-place position). `any` and `alone`: the algorithms cope with every
// overlap (allgather, gather, broadcast stage or move their input first).
[[noreturn, gnu::cold, gnu::noinline]] void overlapRefused(const char* name, const void* send, size_t sbytes,
                                                           const void* recv, size_t rbytes, InPlaceRule ok) {
  throw InvalidArgument(std::string(name) + ": the send buffer " + span(send, sbytes) + " and the receive buffer " +
                        span(recv, rbytes) + " partially overlap; pass " +
                        (ok == InPlaceRule::same ? "the same buffer" : "the receive buffer at this rank's block of the send buffer") +
                        " for in-place operation, or separate buffers");
}
inline void checkOverlap(const char* name, const void* send, size_t sbytes, const void* recv, size_t rbytes,
                         InPlaceRule ok, size_t blk, int r) {
  if (!send || !recv || !sbytes || !rbytes || (ok != InPlaceRule::same && ok != InPlaceRule::block)) return;
  auto s = reinterpret_cast<uintptr_t>(send), d = reinterpret_cast<uintptr_t>(recv);
  if (s + sbytes <= d || d + rbytes <= s) return;  // disjoint
  if (ok == InPlaceRule::same && s == d) return;
  if (ok == InPlaceRule::block && d == s + static_cast<uintptr_t>(r) * blk) return;
  overlapRefused(name, send, sbytes, recv, rbytes, ok);
}

// allreduce_coalesced: each piece's buffers present and within size_t, send
// and receive the same or disjoint, no two pieces' receive buffers (or one's
// receive and another's send) overlapping; returns the total count.
size_t checkPieces(const std::vector<BufPiece>& pieces, DataType dt, int ranks) {
  const size_t es = dtypeSize(dt);
  size_t total = 0;
  std::vector<std::pair<uintptr_t, size_t>> spans;  // (start, index): receive buffers, then foreign sends
  for (size_t i = 0; i < pieces.size(); ++i) {
    const BufPiece& b = pieces[i];
    const std::string name = "allreduce_coalesced: piece " + std::to_string(i);
    if (b.count > SIZE_MAX / es / static_cast<size_t>(ranks) || total > SIZE_MAX / es / static_cast<size_t>(ranks) - b.count)
      throw InvalidArgument(name + ": count " + std::to_string(b.count) + " of " + dtypeName(dt) + " is too large");
    total += b.count;
    if (b.count == 0) continue;
    if (!b.send) throw InvalidArgument(name + ": send buffer is null");
    if (!b.recv) throw InvalidArgument(name + ": receive buffer is null");
    checkOverlap(name.c_str(), b.send, b.count * es, b.recv, b.count * es, collInPlace(CollType::kAllreduceCoalesced),
                 0, 0);
    spans.push_back({reinterpret_cast<uintptr_t>(b.recv), i});
  }
  // Receive buffers pairwise disjoint (sorted by start, each ends before the next begins).
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const BufPiece& prev = pieces[spans[k - 1].second];
    if (spans[k - 1].first + prev.count * es > spans[k].first)
      throw InvalidArgument("allreduce_coalesced: the receive buffers of pieces " + std::to_string(spans[k - 1].second) +
                            " and " + std::to_string(spans[k].second) + " overlap (" + span(prev.recv, prev.count * es) +
                            ", " + span(pieces[spans[k].second].recv, pieces[spans[k].second].count * es) + ")");
  }
  // Out of place: no piece reads a send buffer another piece's result is written into.
  for (size_t i = 0; i < pieces.size(); ++i) {
    const BufPiece& b = pieces[i];
    if (!b.count || b.send == b.recv) continue;
    const auto s = reinterpret_cast<uintptr_t>(b.send), e = s + b.count * es;
    // The receive buffer starting last before e: the only one that can reach
    // into [s, e) (they are disjoint); this piece's own ends at or before s.
    auto it = std::upper_bound(spans.begin(), spans.end(), std::make_pair(e - 1, SIZE_MAX));
    if (it == spans.begin()) continue;
    const auto& [start, j] = *std::prev(it);
    if (j != i && start + pieces[j].count * es > s)
      throw InvalidArgument("allreduce_coalesced: the send buffer of piece " + std::to_string(i) +
                            " overlaps the receive buffer of piece " + std::to_string(j));
  }
  return total;
}

}  // namespace

void Communicator::validate(const CollArgs& a) const {
  const char* name = collName(a.coll);
  if (static_cast<unsigned>(a.coll) >= kNumCollTypes) throw InvalidArgument("unknown collective");
  dtypeSize(a.dtype);
  if (collReduces(a.coll)) checkOpSupported(a.dtype, a.op);
  const bool rooted = collRooted(a.coll);
  if (rooted && (a.root < 0 || a.root >= size_))
    throw InvalidArgument(std::string(name) + ": root " + std::to_string(a.root) + " is out of range for " +
                          std::to_string(size_) + " ranks");
  if ((a.coll == CollType::kSend || a.coll == CollType::kRecv) && (a.peer < 0 || a.peer >= size_ || a.peer == rank_))
    throw InvalidArgument(std::string(name) + ": peer " + std::to_string(a.peer) + " is not another rank of " +
                          std::to_string(size_));
  if (a.coll == CollType::kP2pBatch) {
    for (const P2pOp& o : a.p2p) {
      if (o.peer < 0 || o.peer >= size_)
        throw InvalidArgument(std::string(o.send ? "send" : "recv") + ": peer " + std::to_string(o.peer) +
                              " is out of range for " + std::to_string(size_) + " ranks");
      if (o.count > 0 && !o.buf)
        throw InvalidArgument(std::string(o.send ? "send" : "recv") + ": buffer is null");
    }
    return;
  }
  if (a.coll == CollType::kAllreduceCoalesced) {
    if (a.op == ReduceOp::kAvg && isInteger(a.dtype))
      throw InvalidArgument(std::string("allreduce_coalesced: avg of ") + dtypeName(a.dtype) +
                            " is not supported (integer avg widens its data; use allreduce per buffer)");
    if (checkPieces(a.pieces, a.dtype, size_) != a.count)
      throw InvalidArgument("allreduce_coalesced: count " + std::to_string(a.count) + " is not the pieces' total");
    if (!a.opts.algo.empty() && !findAlgorithm(a.coll, a.opts.algo))
      throw InvalidArgument("allreduce_coalesced: unknown algorithm '" + a.opts.algo + "' (known: " +
                            algorithmList(a.coll) + ")");
    return;
  }
  const bool vcounts = collVcounts(a.coll);  // per-rank counts: `count` does not describe the call
  if (vcounts) {
    if (a.sendcounts.size() != (size_t)size_ || a.sdispls.size() != (size_t)size_ ||
        a.recvcounts.size() != (size_t)size_ || a.rdispls.size() != (size_t)size_)
      throw InvalidArgument(std::string(name) + ": counts and displacements need one entry per rank (" + std::to_string(size_) + ")");
  }
  if (a.coll == CollType::kBarrier) return;
  if (a.count > 0 || vcounts) {
    // The buffers this rank's part of the call uses (the byte rule, vocab.def's send and recv
    // columns); `alone`: the receive buffer alone is the call in place (broadcast).
    const BufShape& sh = kShapes[static_cast<int>(a.coll)];
    const bool at_root = a.root == rank_;
    bool needs_send = sh.send[at_root] && sh.rule != InPlaceRule::alone;
    bool needs_recv = sh.recv[at_root];
    if (sh.rule == InPlaceRule::alone && !a.recvbuf) throw InvalidArgument(std::string(name) + ": buffer is null");
    if (vcounts) {
      size_t s = std::accumulate(a.sendcounts.begin(), a.sendcounts.end(), size_t{0});
      size_t r = std::accumulate(a.recvcounts.begin(), a.recvcounts.end(), size_t{0});
      needs_send = s > 0;
      needs_recv = r > 0;
    }
    if (needs_send && !a.sendbuf) throw InvalidArgument(std::string(name) + ": send buffer is null");
    if (needs_recv && !a.recvbuf) throw InvalidArgument(std::string(name) + ": receive buffer is null");
  }
  if (!vcounts) checkBuffers(a);
  if (!a.opts.algo.empty() && !findAlgorithm(a.coll, a.opts.algo))
    throw InvalidArgument(std::string(name) + ": unknown algorithm '" + a.opts.algo + "' (known: " +
                          algorithmList(a.coll) + ")");
}

// Sizes fit size_t, and send/receive ranges overlap only where supported.
void Communicator::checkBuffers(const CollArgs& a) const {
  const char* name = collName(a.coll);
  const size_t es = dtypeSize(a.dtype), p = static_cast<size_t>(size_);
  if (a.count > SIZE_MAX / es / p)
    throw InvalidArgument(std::string(name) + ": count " + std::to_string(a.count) + " of " + dtypeName(a.dtype) +
                          " is too large");
  // Where the buffers may overlap (the in-place rule) and the bytes each holds on this rank (the
  // byte rule): vocab.def's inplace, send and recv columns. Only `same` and `block` refuse overlaps.
  const BufShape& sh = kShapes[static_cast<int>(a.coll)];
  if (sh.rule != InPlaceRule::same && sh.rule != InPlaceRule::block) return;
  const size_t blk = a.count * es;
  const bool at_root = a.root == rank_;
  checkOverlap(name, a.sendbuf, shapeBytes(sh.send[at_root], blk, p), a.recvbuf, shapeBytes(sh.recv[at_root], blk, p),
               sh.rule, blk, rank_);
}

}  // namespace harp
