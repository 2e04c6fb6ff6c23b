// Scatter, linear: the root sends block q of its input to rank q (all sends
// posted at once); every other rank receives one block.
// Any p, any root; sendbuf is only used on the root.
// Cost: alpha + max((p-2)·o + n·beta, (p-1)·n·beta) at the root (o: per-message
// overhead, TransportParams::overhead; the sends are posted at once, so latencies
// overlap, and each moves while the next is posted: burstSeconds). Where a line caps
// each flow below its link rate, the p-1 flows share the link (sharedLinkSeconds).
// Descriptor check: as a rooted collective it also runs the communicator's
// exact descriptor check (Communicator::runCollective): p-1 messages of 24
// bytes per rank alongside the data, one extra latency for ranks that only
// send (2 ranks, 8 bytes: shm +0.5 us, tcp +15 us).
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void scatterLinear(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  if (r != a.root) {
    if (blk) ctx.wait(ctx.irecv(a.root, a.recvbuf, blk));
    return;
  }
  const char* in = static_cast<const char*>(a.sendbuf);
  copyBytes(a.recvbuf, in + r * blk, blk);
  if (!blk) return;
  std::vector<Request*> reqs;
  for (int q = 0; q < p; ++q)
    if (q != r) reqs.push_back(ctx.isend(q, in + q * blk, blk));
  ctx.waitAll(reqs);
}

namespace {
double linearCost(double n, int p, const TransportParams& t) { return burstSeconds(t, p - 1, n * t.beta, sharedLinkSeconds(t, n, p - 1)); }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kScatter, .name = "linear", .fn = scatterLinear, .cost = linearCost,
                         .root_check = RootCheck::kFromRoot});

}  // namespace harp
