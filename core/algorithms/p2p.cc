// Point-to-point send and recv ("direct"): one message to or from one peer.
// Messages between two ranks match in order; the user tag, count and dtype
// travel in the message tag and must agree on both sides (a disagreement is
// an error naming both, like a collective mismatch).
// Cost: alpha + n·beta.
#include "core/algorithms/registry.h"

namespace harp {

void sendDirect(Context& ctx) {
  const CollArgs& a = ctx.args();
  ctx.wait(ctx.isend(a.peer, a.sendbuf, a.count * ctx.elemSize()));
}

void recvDirect(Context& ctx) {
  const CollArgs& a = ctx.args();
  ctx.wait(ctx.irecv(a.peer, a.recvbuf, a.count * ctx.elemSize()));
}

namespace {
double directCost(double n, int, const TransportParams& t) { return t.alpha + n * t.beta; }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kSend, .name = "direct", .fn = sendDirect, .cost = directCost});
HARP_REGISTER_ALGORITHM({.coll = CollType::kRecv, .name = "direct", .fn = recvDirect, .cost = directCost});

}  // namespace harp
