// Reduce-scatter, Bruck (dimension-reversed): the Bruck allgather run
// backwards, ceil(log2 p) steps for any p, no fold. The input is p blocks of
// `count`; rank r ends with block r reduced (NCCL's layout).
//
// Rank r works in a rotated buffer R (scratch, p blocks) where R[i] holds its
// partial sum of block (r+i) mod p, initially its input. Distances are taken
// largest first (d = 2^(K-1), ..., 2, 1, K = ceil(log2 p)), the allgather's
// order reversed: at the step with distance d, with c = min(d, p-d), r sends
// R[d, d+c) (blocks r+d .. r+d+c-1) to r+d, for which they are R[0, c), and
// reduces the c blocks arriving from r-d into its own R[0, c). Every
// contribution to block j travels along the reversed path by which the Bruck
// allgather would have brought block j to each rank, so each is added exactly
// once; after the step with d = 1, R[0] is block r reduced, and that last
// reduction goes straight into recvbuf. Unlike recursive halving, p need not
// be a power of two: no rank sits out and nobody ships its whole input (the
// fold's 2 extra latencies and p·count extra bytes).
//
// Buffers: R (p blocks) plus one receive buffer of at most p/2 blocks; not
// PAT's log-sized staging (which sends block by block over more steps). They
// are bounded instead: where 1.5·p blocks exceed 16·HARP_SEGMENT_BYTES (8 MiB
// by default) the blocks are cut into slices of as many elements as fit and
// the whole algorithm runs once per slice (more steps, large blocks only).
// Restriction: commutative op (the order of reduction differs per block;
// every HARP op is commutative today); fallback "ring". Any count; in place
// when recvbuf == sendbuf + r·count; the input is never modified.
// Cost: ceil(log2 p)·alpha + (p-1)·count·(beta + gamma) + p·count·gamma (the
// p-block rotation copy, costed at the per-byte reduction time, the nearest
// local-memory figure TransportParams has). One slice assumed.
#include <algorithm>

#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp {

void reduceScatterBruck(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize(), blk = a.count * es;
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  if (p == 1 || blk == 0) return copyBytes(out, in + r * blk, blk);
  int top = 1;
  while (top * 2 < p) top *= 2;  // 2^(K-1)
  const size_t room = static_cast<size_t>(p + p / 2), budget = 16 * ctx.segmentBytes();
  const size_t slice = room * blk <= budget ? a.count : std::max<size_t>(1, budget / (room * es));
  char* rot = static_cast<char*>(ctx.scratch(room * slice * es));
  char* tmp = rot + p * slice * es;
  for (size_t s0 = 0; s0 < a.count; s0 += slice) {
    const size_t n = std::min(slice, a.count - s0), b = n * es, at = s0 * es;
    // R[i] = this slice of block (r+i) mod p (in place: block r's slice is read here, before
    // the slice's result overwrites it).
    if (b == blk) {
      copyBytes(rot, in + r * blk, (p - r) * blk);
      copyBytes(rot + (p - r) * blk, in, r * blk);
    } else {
      for (int i = 0; i < p; ++i) copyBytes(rot + i * b, in + ((r + i) % p) * blk + at, b);
    }
    for (int d = top; d >= 1; d /= 2) {
      const int c = std::min(d, p - d);
      ctx.sendrecv((r + d) % p, rot + d * b, c * b, (r - d + p) % p, tmp, c * b);
      reduce(d == 1 ? out + at : rot, rot, tmp, c * n, a.dtype, a.op);
    }
  }
}

namespace {
double bruckCost(double n, int p, const TransportParams& t) {
  return ceilLog2(p) * t.alpha + (p - 1) * n * (t.beta + t.gamma) + p * n * t.gamma;
}

// Across H hosts of L block-placed ranks (powers of two): the allgather's
// host cost (allgather_bruck.cc) run backwards, plus the reductions:
//   log2(p)·a_e + L·(p-L)·n·b_e + (L-1)·n·b_i + (2p-1)·n·gamma
// (every step's latency is the host line's: the ranks at each host's edge send
// across, and the next step waits for them; allgather_bruck.cc)
double bruckHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const int H = s.hosts, L = s.local, p = H * L;
  if (floorPow2(H) != H || floorPow2(L) != L) return bruckCost(n, p, ex);
  return ceilLog2(p) * ex.alpha + sharedLinkSeconds(ex, static_cast<double>(p - L) * n, L) + (L - 1) * n * in.beta +
         (2.0 * p - 1) * n * ex.gamma;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduceScatter, .name = "bruck", .fn = reduceScatterBruck,
                         .restrictions = {.commutative_op = true}, .cost = bruckCost, .fallback = "ring",
                         .flat_hier_cost = bruckHostsCost});

}  // namespace harp
