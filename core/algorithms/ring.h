// core/algorithms/ring.h — the ring allreduce as a peer pattern over any chunk
// layout: allreduce_ring.cc runs it on equal chunks (Blocks), allreduce
// ring_weighted on chunks sized to the links (allreduce_ring_weighted.cc).
//
// Usage: ringAllreduce(ctx, chunks), where `chunks` has size(i) and offset(i)
// in elements for i in [0, p), the chunks tiling [0, count) in order. Rank r
// sends to r+1 and receives from r-1. In p-1 reduce-scatter steps each rank
// forwards one chunk, reducing the chunk arriving from its left into its own
// copy; after them rank r holds the full reduction of chunk (r+1) mod p; p-1
// allgather steps circulate the reduced chunks. Each chunk travels in segments
// (HARP_SEGMENT_BYTES): a segment is forwarded as soon as it is reduced, so the
// next step's sends overlap this step's reductions and receives.
//
// Bytes each rank sends: rank r sends every chunk but r+1 in the
// reduce-scatter, chunk r+1 as the first allgather step, then every chunk but
// r+1 and r+2: 2n - b(r+1) - b(r+2) for chunk sizes b (2(p-1)/p·n for equal
// chunks). ring_weighted sizes the chunks from this.
//
// Any p >= 1, any count (chunks may be empty), in place or not; results are
// bitwise identical on all ranks (each chunk is reduced by one rank, then copied).
// Lifetime/threading: runs inside one collective, on its executing thread.
#pragma once

#include <algorithm>
#include <vector>

#include "base/reduce.h"
#include "core/algorithms/registry.h"

namespace harp {

template <class Chunks>
void ringAllreduce(Context& ctx, const Chunks& chunks) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(a.sendbuf);
  if (p == 1 || a.count == 0) return copyBytes(out, in, a.count * es);

  const size_t seg = std::max<size_t>(1, ctx.segmentBytes() / es);
  auto nseg = [&](int c) { return (chunks.size(c) + seg - 1) / seg; };
  auto segLen = [&](int c, size_t j) { return std::min(seg, chunks.size(c) - j * seg); };
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  // Incoming reduce-scatter segments land in a small ring of segment buffers
  // (not a chunk-sized scratch) that stays in cache: a receive is posted kWindow
  // segments ahead of the reduction that consumes it. Sized by the largest
  // chunk (equal chunks: chunk 0).
  constexpr size_t kWindow = 4;
  size_t most = 0;
  for (int c = 0; c < p; ++c) most = std::max(most, nseg(c));
  const size_t slots = std::min<size_t>(kWindow, std::max<size_t>(1, most));
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

// Chunks of given sizes, in order (ring_weighted's layout).
struct SizedChunks {
  std::vector<size_t> sizes, offsets;  // offsets[i] = sizes[0] + ... + sizes[i-1]
  explicit SizedChunks(std::vector<size_t> s) : sizes(std::move(s)), offsets(sizes.size()) {
    for (size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  }
  size_t size(size_t i) const { return sizes[i]; }
  size_t offset(size_t i) const { return offsets[i]; }
};

// ring_weighted's layout (allreduce_ring_weighted.cc), exposed for its tests.
// link[r]: the rate (any unit) of the link from rank r to rank r+1 mod p.
// Returns the fraction of the vector for each chunk, summing to 1, that
// minimises the ring's time max_r (2 - f(r+1) - f(r+2)) / link[r] (the bytes
// each rank sends, over its link); equal fractions when the rates are within
// `tolerance` (a ratio, e.g. 1.1) of each other. Deterministic: equal inputs
// give bitwise equal outputs.
std::vector<double> ringChunkFractions(const std::vector<double>& link, double tolerance);
// The chunk sizes in elements for `count` (largest remainder; ties to the lower
// index): sizes sum to count exactly.
std::vector<size_t> ringChunkSizes(const std::vector<double>& fractions, size_t count);
// Seconds per byte of vector the ring needs with these fractions: max over r
// of (2 - f(r+1) - f(r+2)) / link[r] (link in bytes per second).
double ringLinkTime(const std::vector<double>& fractions, const std::vector<double>& link);

}  // namespace harp
