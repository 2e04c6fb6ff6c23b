// Allreduce, ring (reduce-scatter then allgather), segmented and pipelined.
//
// The vector is cut into p chunks (sizes differ by at most one element). In
// p-1 reduce-scatter steps each rank sends one chunk to its right neighbour and
// reduces the chunk arriving from its left into its own copy; after them rank r
// holds the full reduction of chunk (r+1) mod p. p-1 allgather steps then
// circulate the reduced chunks. Each chunk travels in segments
// (HARP_SEGMENT_BYTES): a segment is forwarded as soon as it is reduced, so the
// next step's sends overlap this step's reductions and receives.
//
// Any p >= 1, any count (chunks may be empty), in-place or not; results are
// bitwise identical on all ranks (each chunk is reduced by one rank, then copied).
// Cost: 2(p-1)·alpha·s + 2·(p-1)/p·n·beta + (p-1)/p·n·gamma, with s segments
// per chunk (pipelining hides most of the per-segment alpha for large n).
// Bandwidth-optimal; latency grows with p, so the tuning table uses it for
// large messages.
#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp {

void allreduceRing(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(a.sendbuf);
  if (p == 1 || a.count == 0) return copyBytes(out, in, a.count * es);

  const Blocks chunks{a.count, static_cast<size_t>(p)};
  const size_t seg = std::max<size_t>(1, ctx.segmentBytes() / es);
  auto nseg = [&](int c) { return (chunks.size(c) + seg - 1) / seg; };
  auto segLen = [&](int c, size_t j) { return std::min(seg, chunks.size(c) - j * seg); };
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  // Incoming reduce-scatter segments land in a small ring of segment buffers
  // (not a chunk-sized scratch) that stays in cache: a receive is posted kWindow
  // segments ahead of the reduction that consumes it.
  constexpr size_t kWindow = 4;
  const size_t slots = std::min<size_t>(kWindow, std::max<size_t>(1, nseg(0)));
  char* tmp = static_cast<char*>(ctx.scratch(slots * seg * es));
  auto slot = [&](size_t j) { return tmp + (j % slots) * seg * es; };

  std::vector<Request*> sends, recvs;
  // Reduce-scatter step 0 sends this rank's own chunk straight from the input.
  for (size_t j = 0; j < nseg(r); ++j)
    sends.push_back(ctx.isend(right, in + (chunks.offset(r) + j * seg) * es, segLen(r, j) * es));

  for (int s = 0; s < p - 1; ++s) {
    const int c = mod(r - s - 1);
    recvs.clear();
    const size_t n = nseg(c);
    for (size_t j = 0; j < std::min(n, slots); ++j) recvs.push_back(ctx.irecv(left, slot(j), segLen(c, j) * es));
    for (size_t j = 0; j < n; ++j) {
      ctx.wait(recvs[j]);
      const size_t off = (chunks.offset(c) + j * seg) * es;
      reduce(out + off, in + off, slot(j), segLen(c, j), a.dtype, a.op);
      // Slot j % slots is free again: post the receive kWindow segments ahead.
      if (j + slots < n) recvs.push_back(ctx.irecv(left, slot(j + slots), segLen(c, j + slots) * es));
      // Forward at once: next reduce-scatter step, or allgather step 0 after the last.
      sends.push_back(ctx.isend(right, out + off, segLen(c, j) * es));
    }
  }
  for (int s = 0; s < p - 1; ++s) {
    const int c = mod(r - s);
    recvs.clear();
    for (size_t j = 0; j < nseg(c); ++j)
      recvs.push_back(ctx.irecv(left, out + (chunks.offset(c) + j * seg) * es, segLen(c, j) * es));
    for (size_t j = 0; j < nseg(c); ++j) {
      ctx.wait(recvs[j]);
      if (s < p - 2) sends.push_back(ctx.isend(right, out + (chunks.offset(c) + j * seg) * es, segLen(c, j) * es));
    }
  }
  ctx.waitAll(sends);
}

// 2(p-1) steps of n/p bytes (segments overlap: counted once), one reduction of n(p-1)/p.
double ringAllreduceCost(double n, int p, const TransportParams& t) {
  const double f = (p - 1.0) / p;
  return 2 * (p - 1) * t.alpha + 2 * f * n * t.beta + f * n * t.gamma;
}

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "ring", .fn = allreduceRing, .cost = ringAllreduceCost});

}  // namespace harp
