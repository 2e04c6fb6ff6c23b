// Barrier, dissemination: in round k (k = 1, 2, 4, ...) rank r signals
// r + k and waits for r - k (mod p). After ceil(log2 p) rounds every rank has
// heard, transitively, from every other. Any p.
// Cost: ceil(log2 p)·alpha (empty messages).
#include "core/algorithms/registry.h"

namespace harp {

void barrierDissemination(Context& ctx) {
  const int p = ctx.size(), r = ctx.rank();
  char token = 0, got = 0;
  for (int k = 1; k < p; k <<= 1) ctx.sendrecv((r + k) % p, &token, 0, (r - k + p) % p, &got, 0);
}

namespace {
double disseminationCost(double, int p, const TransportParams& t) { return ceilLog2(p) * t.alpha; }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kBarrier, .name = "dissemination", .fn = barrierDissemination, .cost = disseminationCost});

}  // namespace harp
