// Broadcast, pipelined chain. Ranks form a chain from the root
// (vr = (r - root) mod p; vr sends to vr + 1); the message moves in segments
// (HARP_SEGMENT_BYTES) and each rank forwards a segment as soon as it arrives.
// Any p, any root.
// Cost: (p - 2 + s)·(alpha + n/s·beta) for s segments: about n·beta for large
// n regardless of p. Large messages.
// Descriptor check: as a rooted collective it also runs the communicator's
// exact descriptor check (Communicator::runCollective): p-1 messages of 24
// bytes per rank alongside the data, one extra latency for ranks that only
// send (2 ranks, 8 bytes: shm +0.5 us, tcp +15 us).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void broadcastPipeline(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t bytes = a.count * ctx.elemSize();
  char* buf = static_cast<char*>(a.recvbuf);
  if (r == a.root && a.sendbuf) copyBytes(buf, a.sendbuf, bytes);
  if (p == 1 || bytes == 0) return;
  const int vr = (r - a.root + p) % p;
  const int prev = (r - 1 + p) % p, next = (r + 1) % p;
  const size_t seg = std::max<size_t>(ctx.elemSize(), ctx.segmentBytes() / ctx.elemSize() * ctx.elemSize());
  const size_t nseg = (bytes + seg - 1) / seg;
  std::vector<Request*> recvs, sends;
  if (vr > 0)
    for (size_t j = 0; j < nseg; ++j) recvs.push_back(ctx.irecv(prev, buf + j * seg, std::min(seg, bytes - j * seg)));
  for (size_t j = 0; j < nseg; ++j) {
    if (vr > 0) ctx.wait(recvs[j]);
    if (vr < p - 1) sends.push_back(ctx.isend(next, buf + j * seg, std::min(seg, bytes - j * seg)));
  }
  ctx.waitAll(sends);
}

namespace {
// s segments of the default HARP_SEGMENT_BYTES (512 KiB).
double pipelineCost(double n, int p, const TransportParams& t) {
  if (p == 1) return 0;
  const double s = std::max(1.0, std::ceil(n / (512 << 10)));
  return (p - 2 + s) * (t.alpha + n / s * t.beta);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kBroadcast, .name = "pipeline", .fn = broadcastPipeline, .cost = pipelineCost,
                         .root_check = RootCheck::kFromRoot});

}  // namespace harp
