// Allgather, Bruck: ceil(log2 p) steps for any p. Rank r works in a rotated
// buffer R (scratch, p blocks) where R[i] holds block (r+i) mod p; R[0] is its
// own input. At step k (d = 2^k) it sends the first c = min(d, p-d) blocks of R
// to r-d and receives the first c blocks of r+d's R into R[d, d+c) — blocks
// (r+d+i) mod p, which r+d already holds after the steps before. After the last
// step R holds every block; a final rotation copies R[i] to position (r+i) mod
// p of recvbuf. recvbuf is written only then, so every aliasing of sendbuf and
// recvbuf works (in place when sendbuf == recvbuf + r·count, NCCL's rule, or
// anywhere else inside recvbuf).
// Any p, any count. Scratch: p blocks. Log steps: for small blocks and many
// ranks, where the ring's p-1 latencies dominate; same bytes as the ring.
// Cost: ceil(log2 p)·alpha + (p-1)·count·beta (+ p·count local copy, not costed).
#include "core/algorithms/registry.h"

namespace harp {

void allgatherBruck(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(a.sendbuf);
  if (blk == 0) return;
  if (p == 1) return copyBytes(out, in, blk);
  char* rot = static_cast<char*>(ctx.scratch(static_cast<size_t>(p) * blk));
  copyBytes(rot, in, blk);
  for (int d = 1; d < p; d *= 2) {
    const int c = std::min(d, p - d);
    const int to = (r - d + p) % p, from = (r + d) % p;
    ctx.sendrecv(to, rot, c * blk, from, rot + d * blk, c * blk);
  }
  // Rotate into place: R[0, p-r) -> blocks r..p-1, R[p-r, p) -> blocks 0..r-1.
  copyBytes(out + r * blk, rot, (p - r) * blk);
  copyBytes(out, rot + (p - r) * blk, r * blk);
}

namespace {
double bruckCost(double n, int p, const TransportParams& t) { return ceilLog2(p) * t.alpha + (p - 1) * n * t.beta; }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllgather, .name = "bruck", .fn = allgatherBruck, .cost = bruckCost});

}  // namespace harp
