// Gather, linear: every rank sends its block to the root, which receives all
// blocks straight into place (posted at once, so they arrive in parallel).
// Any p, any root; recvbuf is only used on the root.
// Cost: alpha + (p-1)·n·beta at the root (its link is the bottleneck, shared by
// the p-1 flows: sharedLinkSeconds, where a line caps each flow below the link; the
// receives are posted at once, so latencies overlap, and each sender pays its
// one message's overhead in parallel with the others: the root posts no sends.
// Charging the root (p-2) send overheads made leader's allgather, whose host
// gather this is, 1.3-1.4 x its replayed time at 64 KB on 64-256 ranks).
// Descriptor check: as a rooted collective it also runs the communicator's
// exact descriptor check (Communicator::runCollective): p-1 messages of 24
// bytes per rank alongside the data, one extra latency for ranks that only
// send (2 ranks, 8 bytes: shm +0.5 us, tcp +15 us).
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void gatherLinear(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  if (r != a.root) {
    if (blk) ctx.wait(ctx.isend(a.root, a.sendbuf, blk));
    return;
  }
  char* out = static_cast<char*>(a.recvbuf);
  copyBytes(out + r * blk, a.sendbuf, blk);
  if (!blk) return;
  std::vector<Request*> reqs;
  for (int q = 0; q < p; ++q)
    if (q != r) reqs.push_back(ctx.irecv(q, out + q * blk, blk));
  ctx.waitAll(reqs);
}

namespace {
double linearCost(double n, int p, const TransportParams& t) { return p > 1 ? t.alpha + sharedLinkSeconds(t, n, p - 1) : 0; }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kGather, .name = "linear", .fn = gatherLinear, .cost = linearCost,
                         .root_check = RootCheck::kToRoot});

}  // namespace harp
