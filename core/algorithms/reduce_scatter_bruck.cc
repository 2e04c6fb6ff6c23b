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
// PAT's log-sized staging (which sends block by block over more steps).
// Restriction: commutative op (the order of reduction differs per block;
// every HARP op is commutative today); fallback "ring". Any count; in place
// when recvbuf == sendbuf + r·count; the input is never modified.
// Cost: ceil(log2 p)·alpha + (p-1)·count·(beta + gamma) (+ the p-block rotation copy).
#include "core/algorithms/registry.h"
#include "core/base/reduce.h"

namespace harp {

void reduceScatterBruck(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  if (p == 1 || blk == 0) return copyBytes(out, in + r * blk, blk);
  int top = 1;
  while (top * 2 < p) top *= 2;  // 2^(K-1)
  char* rot = static_cast<char*>(ctx.scratch((p + p / 2) * blk));
  char* tmp = rot + p * blk;
  // R[i] = block (r+i) mod p: blocks r..p-1, then 0..r-1.
  copyBytes(rot, in + r * blk, (p - r) * blk);
  copyBytes(rot + (p - r) * blk, in, r * blk);
  for (int d = top; d >= 1; d /= 2) {
    const int c = std::min(d, p - d);
    ctx.sendrecv((r + d) % p, rot + d * blk, c * blk, (r - d + p) % p, tmp, c * blk);
    reduce(d == 1 ? out : rot, rot, tmp, c * a.count, a.dtype, a.op);
  }
}

namespace {
double bruckCost(double n, int p, const TransportParams& t) {
  return ceilLog2(p) * t.alpha + (p - 1) * n * (t.beta + t.gamma);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduceScatter, .name = "bruck", .fn = reduceScatterBruck,
                         .restrictions = {.commutative_op = true}, .cost = bruckCost, .fallback = "ring"});

}  // namespace harp
