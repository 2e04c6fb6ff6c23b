// Reduce-scatter, ring: the input is p blocks of `count` elements; in p-1 steps
// rank r sends a partially reduced block to r+1 and reduces the block arriving
// from r-1 with its own input; the blocks are scheduled so that rank r ends
// with block r fully reduced (NCCL's layout).
// Any p, any count; in-place when recvbuf == sendbuf + r·count. The input is
// never modified (partial sums live in scratch).
// Cost: (p-1)·(alpha + count·beta + count·gamma).
#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp {

void reduceScatterRing(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  if (p == 1 || blk == 0) return copyBytes(out, in + r * blk, blk);
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  char* space = static_cast<char*>(ctx.scratch(3 * blk));
  char* tmp = space;
  char* acc[2] = {space + blk, space + 2 * blk};
  for (int s = 0; s < p - 1; ++s) {
    const int sb = mod(r - s - 1), rb = mod(r - s - 2);
    const char* src = s == 0 ? in + sb * blk : acc[(s - 1) % 2];
    ctx.sendrecv(right, src, blk, left, tmp, blk);
    char* dst = s == p - 2 ? out : acc[s % 2];
    reduce(dst, in + rb * blk, tmp, a.count, a.dtype, a.op);
  }
}

namespace {
double ringCost(double n, int p, const TransportParams& t) {
  return (p - 1) * (t.alpha + n * t.beta + n * t.gamma);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduceScatter, .name = "ring", .fn = reduceScatterRing, .cost = ringCost});

}  // namespace harp
