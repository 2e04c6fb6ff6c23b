// Allgather, ring: in p-1 steps rank r sends the block it received last (its
// own first, straight from sendbuf) to r+1 and receives the next one from r-1,
// straight into place; its own block is copied into position r at the end.
// Sending the first block from sendbuf rather than from the copy lets a
// single-copy transport read lines this rank has not just written (2 ranks
// on shm, 1 MB out of place: 72-76 -> 57-62 us).
// Any p, any count; in-place when sendbuf == recvbuf + r·count (NCCL's rule).
// Cost: (p-1)·alpha + (p-1)/p·N·beta, N = p·count elements in all.
#include "core/algorithms/registry.h"

namespace harp {

void allgatherRing(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(a.sendbuf);
  // sendbuf inside recvbuf anywhere but block r: place it first, before the
  // ring overwrites it.
  const bool early = aliasesOtherBlock(in, out, r, p, blk);
  if (early) copyBytes(out + r * blk, in, blk);
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  for (int s = 0; s < p - 1 && blk; ++s) {
    const int sb = mod(r - s), rb = mod(r - s - 1);
    ctx.sendrecv(right, s == 0 && !early ? in : out + sb * blk, blk, left, out + rb * blk, blk);
  }
  if (!early) copyBytes(out + r * blk, in, blk);
}

namespace {
double ringCost(double n, int p, const TransportParams& t) { return (p - 1) * (t.alpha + n * t.beta); }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllgather, .name = "ring", .fn = allgatherRing, .cost = ringCost});

}  // namespace harp
