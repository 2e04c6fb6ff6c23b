// Broadcast, binomial tree. Ranks are renumbered relative to the root
// (vr = (r - root) mod p); vr receives from vr - 2^j, where 2^j is its lowest
// set bit, then sends to vr + 2^i for every smaller 2^i that is < p.
// Any p, any root; the root copies sendbuf to recvbuf first when they differ.
// Cost: ceil(log2 p)·(alpha + n·beta). Small messages.
// Descriptor check: as a rooted collective it also runs the communicator's
// exact descriptor check (Communicator::runCollective): p-1 messages of 24
// bytes per rank alongside the data, one extra latency for ranks that only
// send (2 ranks, 8 bytes: shm +0.5 us, tcp +15 us).
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void broadcastBinomial(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t bytes = a.count * ctx.elemSize();
  char* buf = static_cast<char*>(a.recvbuf);
  if (r == a.root && a.sendbuf) copyBytes(buf, a.sendbuf, bytes);
  if (p == 1 || bytes == 0) return;
  const int vr = (r - a.root + p) % p;
  auto real = [&](int v) { return (v + a.root) % p; };
  int mask = 1;
  while (mask < p) {
    if (vr & mask) {
      ctx.wait(ctx.irecv(real(vr - mask), buf, bytes));
      break;
    }
    mask <<= 1;
  }
  std::vector<Request*> sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < p) sends.push_back(ctx.isend(real(vr + mask), buf, bytes));
  ctx.waitAll(sends);
}

namespace {
double binomialCost(double n, int p, const TransportParams& t) { return ceilLog2(p) * (t.alpha + n * t.beta); }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kBroadcast, .name = "binomial", .fn = broadcastBinomial, .cost = binomialCost,
                         .root_check = RootCheck::kFromRoot});

}  // namespace harp
