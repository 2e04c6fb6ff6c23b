// Allgather, recursive doubling: log2 p steps for p = 2^k. Before the step with
// mask m (m = 1, 2, ..., p/2) rank r holds the m blocks [r & ~(m-1), +m) of
// recvbuf in place; it exchanges them with r ^ m, whose m blocks are the
// adjacent range, so each step doubles the contiguous range held. Everything
// goes straight into recvbuf (no scratch, no final rotation).
// Restriction: power-of-two ranks; otherwise the declared fallback "bruck"
// (same steps and bytes for any p, through a rotated scratch buffer).
// Any count; in place when sendbuf == recvbuf + r·count (NCCL's rule); a
// sendbuf inside recvbuf anywhere else is moved to block r first (memmove).
// Cost: log2 p·alpha + (p-1)·count·beta; across hosts: recursiveDoublingHostsCost.
#include "core/algorithms/registry.h"

namespace harp {

void allgatherRecursiveDoubling(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  if (blk == 0) return;
  // Block r is written before any receive, so sendbuf anywhere inside recvbuf
  // is read whole first; memmove handles a partial overlap with block r.
  copyBytes(out + r * blk, a.sendbuf, blk);
  for (int m = 1; m < p; m *= 2) {
    const int partner = r ^ m;
    const size_t mine = static_cast<size_t>(r & ~(m - 1)) * blk, theirs = static_cast<size_t>(partner & ~(m - 1)) * blk;
    ctx.sendrecv(partner, out + mine, m * blk, partner, out + theirs, m * blk);
  }
}

namespace {
double recursiveDoublingCost(double n, int p, const TransportParams& t) {
  return ceilLog2(p) * t.alpha + (p - 1) * n * t.beta;
}

// Across H hosts of L block-placed ranks (powers of two): the first log2 L
// rounds (masks < L) stay inside a host ((L-1)·n), the last log2 H pair hosts
// with every rank of a host at once, so its uplink carries L·(p-L)·n:
//   log2(L)·a_i + (L-1)·n·b_i + log2(H)·a_e + L·(p-L)·n·b_e
double recursiveDoublingHostsCost(double n, const HierShape& s, const TransportParams& in,
                                  const TransportParams& ex) {
  const int H = s.hosts, L = s.local, p = H * L;
  if (floorPow2(H) != H || floorPow2(L) != L) return recursiveDoublingCost(n, p, ex);
  return ceilLog2(L) * in.alpha + (L - 1) * n * in.beta + ceilLog2(H) * ex.alpha +
         sharedLinkSeconds(ex, static_cast<double>(p - L) * n, L);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllgather, .name = "recursive_doubling", .fn = allgatherRecursiveDoubling,
                         .restrictions = {.pow2_ranks = true}, .cost = recursiveDoublingCost, .fallback = "bruck",
                         .flat_hier_cost = recursiveDoublingHostsCost});

}  // namespace harp
