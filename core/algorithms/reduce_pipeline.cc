// Reduce, pipelined chain: relative rank p-1 starts, each rank adds its own
// data to the segment coming from vr + 1 and passes it to vr - 1; the root
// (vr = 0) ends the chain. Segments (HARP_SEGMENT_BYTES) let all ranks work at
// once.
// Any p, any root; non-root ranks work in scratch.
// Cost: (p - 2 + s)·(alpha + n/s·(beta + gamma)) for s segments: about
// n·(beta + gamma) for large n. Large messages.
// Descriptor check: as a rooted collective it also runs the communicator's
// exact descriptor check (Communicator::runCollective): p-1 messages of 24
// bytes per rank alongside the data, one extra latency for ranks that only
// send (2 ranks, 8 bytes: shm +0.5 us, tcp +15 us).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp {

void reducePipeline(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize(), bytes = a.count * es;
  const char* in = static_cast<const char*>(a.sendbuf);
  if (p == 1 || bytes == 0) {
    if (r == a.root) copyBytes(a.recvbuf, in, bytes);
    return;
  }
  const int vr = (r - a.root + p) % p;
  const int from = (r + 1) % p, to = (r - 1 + p) % p;
  const size_t seg = std::max<size_t>(1, ctx.segmentBytes() / es) * es;
  const size_t nseg = (bytes + seg - 1) / seg;
  auto len = [&](size_t j) { return std::min(seg, bytes - j * seg); };
  std::vector<Request*> sends;
  if (vr == p - 1) {  // head of the chain: send the input as is
    for (size_t j = 0; j < nseg; ++j) sends.push_back(ctx.isend(to, in + j * seg, len(j)));
    return ctx.waitAll(sends);
  }
  char* space = static_cast<char*>(ctx.scratch(vr == 0 ? bytes : 2 * bytes));
  char* tmp = space;
  char* acc = vr == 0 ? static_cast<char*>(a.recvbuf) : space + bytes;
  std::vector<Request*> recvs;
  for (size_t j = 0; j < nseg; ++j) recvs.push_back(ctx.irecv(from, tmp + j * seg, len(j)));
  for (size_t j = 0; j < nseg; ++j) {
    ctx.wait(recvs[j]);
    reduce(acc + j * seg, in + j * seg, tmp + j * seg, len(j) / es, a.dtype, a.op);
    if (vr > 0) sends.push_back(ctx.isend(to, acc + j * seg, len(j)));
  }
  ctx.waitAll(sends);
}

namespace {
// s segments of the default HARP_SEGMENT_BYTES (512 KiB).
double pipelineCost(double n, int p, const TransportParams& t) {
  if (p == 1) return 0;
  const double s = std::max(1.0, std::ceil(n / (512 << 10)));
  return (p - 2 + s) * (t.alpha + n / s * (t.beta + t.gamma));
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduce, .name = "pipeline", .fn = reducePipeline, .cost = pipelineCost});

}  // namespace harp
