// Gather, binomial tree. Ranks are renumbered relative to the root
// (v = (r - root) mod p); rank v owns the relative blocks [v, v + s(v)) with
// s(v) = min(lowbit(v), p - v) (the root: all p). Each rank posts one receive
// per child v + 2^i (2^i < lowbit(v), v + 2^i < p), whose whole subtree range
// arrives as one message, waits for them, then sends its own range to its
// parent v - lowbit(v). ceil(log2 p) rounds. Inner ranks assemble their range
// in scratch (their own block first); leaves send sendbuf as it is. The root
// receives each child's range straight into recvbuf at the real positions
// (v + root) mod p; the one range that wraps past rank p-1 (if any) comes to
// scratch and is copied in two pieces.
// Any p, any root; as gather_linear: recvbuf is only used on the root, where
// the root's own block is copied in first (no copy when sendbuf is already
// there: in place); count 0 moves nothing.
// Cost: ceil(log2 p)·alpha + (p-1)·n·beta along the critical path (round k
// moves 2^k blocks); the root receives the same n(p-1) bytes as linear in
// ceil(log2 p) messages instead of p-1. Bytes sent per rank: n·s(v) (inner
// ranks forward their subtree; n·(p/2)·log2 p in all for p a power of two,
// against n(p-1) for linear). Small blocks, many ranks.
// Descriptor check: the full exchange (CheckShape::kAll, as reduce_binomial,
// whose message pattern this is): data reaches the root through inner ranks,
// so the kToRoot shape (the root hears only from the leaves' data) is not
// safe — an inner rank waiting for a child that has another idea of the root
// would wait for a message nobody sends while the root hears from no one.
// Here the root compares every rank's descriptor in the call.
#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void gatherBinomial(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  const int v = (r - a.root + p) % p;
  auto real = [&](int u) { return (u + a.root) % p; };
  if (v == 0) {
    char* out = static_cast<char*>(a.recvbuf);
    copyBytes(out + r * blk, a.sendbuf, blk);
    if (p == 1 || !blk) return;
    std::vector<Request*> reqs;
    char* wrap = nullptr;
    int wrap_start = 0, wrap_n = 0;
    for (int m = 1; m < p; m <<= 1) {
      const int s = std::min(m, p - m), start = real(m);
      if (start + s <= p) {
        reqs.push_back(ctx.irecv(start, out + start * blk, s * blk));
      } else {  // relative range [m, m + s) runs past real rank p-1
        wrap = static_cast<char*>(ctx.scratch(s * blk));
        wrap_start = start;
        wrap_n = s;
        reqs.push_back(ctx.irecv(start, wrap, s * blk));
      }
    }
    ctx.waitAll(reqs);
    if (wrap) {
      const int first = p - wrap_start;
      copyBytes(out + wrap_start * blk, wrap, first * blk);
      copyBytes(out, wrap + first * blk, (wrap_n - first) * blk);
    }
    return;
  }
  if (!blk) return;
  const int low = v & -v, span = std::min(low, p - v), parent = real(v - low);
  if (span == 1) {
    ctx.wait(ctx.isend(parent, a.sendbuf, blk));
    return;
  }
  char* buf = static_cast<char*>(ctx.scratch(span * blk));
  copyBytes(buf, a.sendbuf, blk);
  std::vector<Request*> reqs;
  for (int m = 1; m < low && v + m < p; m <<= 1)
    reqs.push_back(ctx.irecv(real(v + m), buf + m * blk, std::min(m, p - v - m) * blk));
  ctx.waitAll(reqs);
  ctx.wait(ctx.isend(parent, buf, span * blk));
}

namespace {
double binomialCost(double n, int p, const TransportParams& t) {
  return ceilLog2(p) * t.alpha + (p - 1) * n * t.beta;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kGather, .name = "binomial", .fn = gatherBinomial, .cost = binomialCost});

}  // namespace harp
