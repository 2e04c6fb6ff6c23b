// Scatter, binomial tree (the mirror of gather_binomial). Ranks are renumbered
// relative to the root (v = (r - root) mod p); rank v receives the relative
// blocks [v, v + s(v)), s(v) = min(lowbit(v), p - v), from its parent
// v - lowbit(v) in one message, then sends each child v + 2^i (2^i <
// lowbit(v), v + 2^i < p, largest first) its subtree's range and keeps block
// v. ceil(log2 p) rounds. The root sends each child's range straight from
// sendbuf (real positions (v + root) mod p); the one range that wraps past
// rank p-1 (if any) is packed into scratch first. Inner ranks receive their
// range into scratch; leaves straight into recvbuf.
// Any p, any root; as scatter_linear: sendbuf is only used on the root, whose
// recvbuf may be its own block of sendbuf (in place: no copy); count 0 moves
// nothing.
// Cost: ceil(log2 p)·alpha + (p-1)·n·beta along the critical path (the root
// sends n(p-1) bytes as linear does, in ceil(log2 p) messages instead of p-1).
// Bytes sent per rank: inner ranks forward n·(s(v)-1), the root n(p-1).
// Small blocks, many ranks.
// Descriptor check: kFromRoot, as broadcast_binomial, whose message pattern
// this is (same edges, same order; only the lengths differ, and they follow
// from root, count and p, which the tag carries): every rank's data comes from
// the root through ranks whose tags matched, and a receiver compares its
// peers' descriptors while it waits for that data.
#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void scatterBinomial(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  const int v = (r - a.root + p) % p;
  auto real = [&](int u) { return (u + a.root) % p; };
  int top = 1;
  while (top < p) top <<= 1;
  if (v == 0) {
    const char* in = static_cast<const char*>(a.sendbuf);
    std::vector<Request*> reqs;
    if (p > 1 && blk)
      for (int m = top >> 1; m >= 1; m >>= 1) {
        const int s = std::min(m, p - m), start = real(m);
        if (start + s <= p) {
          reqs.push_back(ctx.isend(start, in + start * blk, s * blk));
        } else {  // relative range [m, m + s) runs past real rank p-1
          char* pack = static_cast<char*>(ctx.scratch(s * blk));
          const int first = p - start;
          copyBytes(pack, in + start * blk, first * blk);
          copyBytes(pack + first * blk, in, (s - first) * blk);
          reqs.push_back(ctx.isend(start, pack, s * blk));
        }
      }
    copyBytes(a.recvbuf, in + r * blk, blk);
    ctx.waitAll(reqs);
    return;
  }
  if (!blk) return;
  const int low = v & -v, span = std::min(low, p - v), parent = real(v - low);
  if (span == 1) {
    ctx.wait(ctx.irecv(parent, a.recvbuf, blk));
    return;
  }
  char* buf = static_cast<char*>(ctx.scratch(span * blk));
  ctx.wait(ctx.irecv(parent, buf, span * blk));
  std::vector<Request*> reqs;
  for (int m = low >> 1; m >= 1; m >>= 1)
    if (v + m < p) reqs.push_back(ctx.isend(real(v + m), buf + m * blk, std::min(m, p - v - m) * blk));
  copyBytes(a.recvbuf, buf, blk);
  ctx.waitAll(reqs);
}

namespace {
double binomialCost(double n, int p, const TransportParams& t) {
  return ceilLog2(p) * t.alpha + (p - 1) * n * t.beta;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kScatter, .name = "binomial", .fn = scatterBinomial,
                         .cost = binomialCost, .root_check = RootCheck::kFromRoot});

}  // namespace harp
