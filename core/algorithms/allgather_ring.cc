// Allgather, ring: rank r puts its block at position r, then in p-1 steps
// sends the block it received last (its own first) to r+1 and receives the
// next one from r-1, straight into place.
// Any p, any count; in-place when sendbuf == recvbuf + r·count (NCCL's rule).
// Cost: (p-1)·alpha + (p-1)/p·N·beta, N = p·count elements in all.
#include "core/algorithms/registry.h"

namespace harp {

void allgatherRing(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  copyBytes(out + r * blk, a.sendbuf, blk);
  if (p == 1 || blk == 0) return;
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  for (int s = 0; s < p - 1; ++s) {
    const int sb = mod(r - s), rb = mod(r - s - 1);
    ctx.sendrecv(right, out + sb * blk, blk, left, out + rb * blk, blk);
  }
}

}  // namespace harp
