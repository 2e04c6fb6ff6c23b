// Allgather, Bruck: ceil(log2 p) steps for any p. Rank r works in a rotated
// buffer R (scratch, p blocks) where R[i] holds block (r+i) mod p; R[0] is its
// own input. At step k (d = 2^k) it sends the first c = min(d, p-d) blocks of R
// to r-d and receives the first c blocks of r+d's R into R[d, d+c) — blocks
// (r+d+i) mod p, which r+d already holds after the steps before. After the last
// step R holds every block; a final rotation copies R[i] to position (r+i) mod
// p of recvbuf. recvbuf is written only then, so every aliasing of sendbuf and
// recvbuf works (in place when sendbuf == recvbuf + r·count, NCCL's rule, or
// anywhere else inside recvbuf).
// Scratch is bounded: where p blocks exceed 16·HARP_SEGMENT_BYTES (8 MiB by
// default) the blocks are cut into slices of as many elements as fit and the
// whole algorithm runs once per slice (more steps, for large blocks only,
// where the ring is the table's pick anyway); a sendbuf inside recvbuf other
// than at block r is then staged whole first, since recvbuf is written slice
// by slice.
// Any p, any count. Log steps: for small blocks and many ranks, where the
// ring's p-1 latencies dominate; same bytes as the ring.
// Cost: ceil(log2 p)·alpha + (p-1)·count·beta + p·count·gamma: the final
// rotation copies p blocks, costed at the per-byte reduction time (the nearest
// local-memory figure TransportParams has), so the cost model, where the table
// is silent, keeps large blocks on the ring (measured: 4 ranks shm 1 MB bruck
// 6.2 ms vs ring 3.6 ms). One slice assumed.
#include <algorithm>

#include "core/algorithms/registry.h"

namespace harp {

void allgatherBruck(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize(), blk = a.count * es;
  char* out = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(a.sendbuf);
  if (blk == 0) return;
  if (p == 1) return copyBytes(out, in, blk);
  const size_t budget = 16 * ctx.segmentBytes();
  const size_t slice = p * blk <= budget ? a.count : std::max<size_t>(1, budget / (p * es));
  const bool stage = slice < a.count && aliasesOtherBlock(in, out, r, p, blk);
  char* rot = static_cast<char*>(ctx.scratch(p * slice * es + (stage ? blk : 0)));
  if (stage) {
    copyBytes(rot + p * slice * es, in, blk);
    in = rot + p * slice * es;
  }
  for (size_t s0 = 0; s0 < a.count; s0 += slice) {
    const size_t b = std::min(slice, a.count - s0) * es, at = s0 * es;
    copyBytes(rot, in + at, b);
    for (int d = 1; d < p; d *= 2) {
      const int c = std::min(d, p - d);
      const int to = (r - d + p) % p, from = (r + d) % p;
      ctx.sendrecv(to, rot, c * b, from, rot + d * b, c * b);
    }
    // Rotate into place: R[i] -> block (r+i) mod p.
    if (b == blk) {
      copyBytes(out + r * blk, rot, (p - r) * blk);
      copyBytes(out, rot + (p - r) * blk, r * blk);
    } else {
      for (int i = 0; i < p; ++i) copyBytes(out + ((r + i) % p) * blk + at, rot + i * b, b);
    }
  }
}

namespace {
double bruckCost(double n, int p, const TransportParams& t) {
  return ceilLog2(p) * t.alpha + (p - 1) * n * t.beta + p * n * t.gamma;
}

// Across H hosts of L block-placed ranks (powers of two): the steps with
// distance d >= L carry (p-L)·n per rank with every rank of a host sending at
// once (L·(p-L)·n on its uplink); those with d < L mostly stay inside it (a
// share d/L of their bytes crosses; counted as inside). Every step's latency is
// the host line's: the d ranks at the top of each host send across, and the
// next step waits for them (at 256 ranks, 8 B, 1 ms: 8 host latencies replayed,
// where log2(L) shm ones and log2(H) host ones predicted 0.64 x that):
//   log2(p)·a_e + (L-1)·n·b_i + L·(p-L)·n·b_e + p·n·gamma
double bruckHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const int H = s.hosts, L = s.local, p = H * L;
  if (floorPow2(H) != H || floorPow2(L) != L) return bruckCost(n, p, ex);
  return ceilLog2(p) * ex.alpha + (L - 1) * n * in.beta + sharedLinkSeconds(ex, static_cast<double>(p - L) * n, L) +
         p * n * ex.gamma;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllgather, .name = "bruck", .fn = allgatherBruck, .cost = bruckCost,
                         .flat_hier_cost = bruckHostsCost});

}  // namespace harp
