// Allreduce, ring with a narrow wire (fp16 or bf16) for float32 sum/avg
// (core/compress/compress.h: when it runs, error bound, mismatch handling).
//
// Steps, p ranks, the vector cut into p chunks (Blocks), each travelling in
// segments of HARP_SEGMENT_BYTES/4 elements:
//   reduce-scatter, p-1 steps: rank r narrows its chunk r and sends it right;
//     at step s it receives the narrow partial sum of chunk c = r-s-1 from the
//     left, adds it to its own float32 input in float32 (never in the narrow
//     type), narrows the float32 sum and forwards it. After the last step rank
//     r holds the float32 sum of chunk r+1.
//   the owner rounds that sum to the narrow type once, widens the rounded value
//     into its own output (so it keeps exactly what the others will get), and
//     sends the narrow chunk right;
//   allgather, p-1 steps: each narrow chunk is received, widened into the
//     output and forwarded. Every rank widens the same narrow bits: results are
//     bit-identical on every rank and run to run.
// Any p >= 2, any count >= 1, in place or not. Bytes sent per rank:
// 2(p-1)/p * n/2 (n float32 bytes), counted in CompressEngine::bytes_sent.
// Scratch: 2 bytes per element (outgoing reduce-scatter partials and the
// allgather chunks in separate halves, so a pending send is never overwritten)
// plus 4 receive segments.
// Cost: 2(p-1)·alpha + (p-1)/p·n·beta + (p-1)/p·n·gamma (float32 sums)
//       + 3·(p-1)/p·n·gamma (narrowing and widening: one pass of each per
//       element per phase, each about a reduction's cost per float32 byte).
#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/compress/compress.h"

namespace harp {

void allreduceRingNarrow(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const NarrowKernels& k = narrowKernels(a.compress.kind);
  float* out = static_cast<float*>(a.recvbuf);
  const float* in = static_cast<const float*>(a.sendbuf);
  const Blocks chunks{a.count, static_cast<size_t>(p)};
  const size_t seg = std::max<size_t>(1, ctx.segmentBytes() / sizeof(float));
  auto nseg = [&](int c) { return (chunks.size(c) + seg - 1) / seg; };
  auto segLen = [&](int c, size_t j) { return std::min(seg, chunks.size(c) - j * seg); };
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  constexpr size_t kWindow = 4;
  const size_t slots = std::min<size_t>(kWindow, std::max<size_t>(1, nseg(0)));
  const size_t n = a.count;
  // [rs: n narrow][ag: n narrow][slots x seg narrow]
  auto* wire = static_cast<uint16_t*>(ctx.scratch((2 * n + slots * seg) * sizeof(uint16_t)));
  uint16_t* rs = wire;
  uint16_t* ag = wire + n;
  uint16_t* tmp = wire + 2 * n;
  auto slot = [&](size_t j) { return tmp + (j % slots) * seg; };
  uint64_t sent = 0;
  std::vector<Request*> sends, recvs;
  auto send = [&](uint16_t* buf, size_t len) {
    sends.push_back(ctx.isend(right, buf, len * sizeof(uint16_t)));
    sent += len * sizeof(uint16_t);
  };

  // Reduce-scatter step 0: this rank's own chunk, narrowed.
  for (size_t j = 0; j < nseg(r); ++j) {
    const size_t off = chunks.offset(r) + j * seg;
    k.narrow(rs + off, in + off, segLen(r, j));
    send(rs + off, segLen(r, j));
  }
  for (int s = 0; s < p - 1; ++s) {
    const int c = mod(r - s - 1);
    const bool last = s == p - 2;  // c is this rank's block: it becomes an allgather chunk
    uint16_t* fwd = last ? ag : rs;
    recvs.clear();
    const size_t m = nseg(c);
    for (size_t j = 0; j < std::min(m, slots); ++j) recvs.push_back(ctx.irecv(left, slot(j), segLen(c, j) * 2));
    for (size_t j = 0; j < m; ++j) {
      ctx.wait(recvs[j]);
      const size_t off = chunks.offset(c) + j * seg, len = segLen(c, j);
      k.add(out + off, in + off, slot(j), len);  // float32 sum of the partial and this rank's input
      if (j + slots < m) recvs.push_back(ctx.irecv(left, slot(j + slots), segLen(c, j + slots) * 2));
      k.narrow(fwd + off, out + off, len);
      if (last) k.widen(out + off, fwd + off, len);  // the owner keeps the rounded value too
      send(fwd + off, len);
    }
  }
  for (int s = 0; s < p - 1; ++s) {
    const int c = mod(r - s);
    recvs.clear();
    for (size_t j = 0; j < nseg(c); ++j)
      recvs.push_back(ctx.irecv(left, ag + chunks.offset(c) + j * seg, segLen(c, j) * 2));
    for (size_t j = 0; j < nseg(c); ++j) {
      ctx.wait(recvs[j]);
      const size_t off = chunks.offset(c) + j * seg;
      if (s < p - 2) send(ag + off, segLen(c, j));
      k.widen(out + off, ag + off, segLen(c, j));
    }
  }
  ctx.waitAll(sends);
  a.compress.engine->bytes_sent.fetch_add(sent, std::memory_order_relaxed);
}

// The cost of the comment above; n in float32 bytes.
double ringNarrowCost(double n, int p, const TransportParams& t) {
  const double f = (p - 1.0) / p;
  return 2 * (p - 1) * t.alpha + f * n * t.beta + 4 * f * n * t.gamma;
}

}  // namespace harp
