// Reduce, binomial tree (the mirror of broadcast_binomial): relative rank vr
// receives from vr + 2^i for each 2^i below its lowest set bit (if < p),
// reducing each into its accumulator, then sends the accumulator to vr - 2^j.
// Any p, any root. Non-root ranks accumulate in scratch; recvbuf is only
// written on the root.
// Cost: ceil(log2 p)·(alpha + n·beta + n·gamma). Small messages.
// Descriptor check: as a rooted collective it also runs the communicator's
// exact descriptor check (Communicator::runCollective): p-1 messages of 24
// bytes per rank alongside the data, one extra latency for ranks that only
// send (2 ranks, 8 bytes: shm +0.5 us, tcp +15 us).
#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp {

void reduceBinomial(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t bytes = a.count * ctx.elemSize();
  if (bytes == 0) return;
  char* space = static_cast<char*>(ctx.scratch(2 * bytes));
  char* acc = r == a.root ? static_cast<char*>(a.recvbuf) : space;
  char* tmp = space + bytes;
  copyBytes(acc, a.sendbuf, bytes);
  const int vr = (r - a.root + p) % p;
  auto real = [&](int v) { return (v + a.root) % p; };
  for (int mask = 1; mask < p; mask <<= 1) {
    if (vr & mask) {
      ctx.wait(ctx.isend(real(vr - mask), acc, bytes));
      return;
    }
    if ((vr | mask) < p) {
      ctx.wait(ctx.irecv(real(vr | mask), tmp, bytes));
      reduce(acc, acc, tmp, a.count, a.dtype, a.op);
    }
  }
}

namespace {
double binomialCost(double n, int p, const TransportParams& t) {
  return ceilLog2(p) * (t.alpha + n * t.beta + n * t.gamma);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduce, .name = "binomial", .fn = reduceBinomial, .cost = binomialCost});

}  // namespace harp
