// Point-to-point batch ("batch"): the sends and receives of one group
// (NCCL's ncclGroupStart ... ncclSend/ncclRecv ... ncclGroupEnd) posted all at
// once and then waited for together, so patterns such as alltoall or a ring
// shift, where every rank sends before it receives, cannot deadlock.
//
// Each message carries the tag a single send/recv of the same count, dtype and
// user tag would carry, so a batch on one rank matches plain send/recv calls on
// its peer, and a count or dtype disagreement is reported like any mismatch.
// Messages between two ranks match in posting order (the transports' per-pair
// FIFO). Sends to this rank itself are copied locally into this rank's own
// receives from itself, in order; an unpaired or differently-sized self
// message is an argument error.
// Cost: max over peers of (messages·alpha + bytes·beta); transfers overlap.
#include <string>
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void p2pBatch(Context& ctx) {
  const CollArgs& a = ctx.args();
  const size_t es = ctx.elemSize();
  std::vector<const P2pOp*> self_sends, self_recvs;
  for (const P2pOp& o : a.p2p) {
    if (o.peer != ctx.rank()) continue;
    (o.send ? self_sends : self_recvs).push_back(&o);
  }
  if (self_sends.size() != self_recvs.size())
    throw InvalidArgument("p2p group on rank " + std::to_string(ctx.rank()) + " has " +
                          std::to_string(self_sends.size()) + " send(s) to itself but " +
                          std::to_string(self_recvs.size()) + " receive(s) from itself");
  for (size_t i = 0; i < self_sends.size(); ++i)
    if (self_sends[i]->count != self_recvs[i]->count)
      throw InvalidArgument("p2p group on rank " + std::to_string(ctx.rank()) + ": send to itself of " +
                            std::to_string(self_sends[i]->count) + " elements is paired with a receive of " +
                            std::to_string(self_recvs[i]->count));

  // Receives first, so a peer's early data lands in the user buffer directly.
  std::vector<Request*> reqs;
  reqs.reserve(a.p2p.size());
  for (const P2pOp& o : a.p2p) {
    if (o.send || o.peer == ctx.rank()) continue;
    uint64_t tag = makeP2pTag(a.dtype, a.tag);
    reqs.push_back(ctx.irecv(o.peer, o.buf, o.count * es, tag));
  }
  for (const P2pOp& o : a.p2p) {
    if (!o.send || o.peer == ctx.rank()) continue;
    uint64_t tag = makeP2pTag(a.dtype, a.tag);
    reqs.push_back(ctx.isend(o.peer, o.buf, o.count * es, tag));
  }
  for (size_t i = 0; i < self_sends.size(); ++i) copyBytes(self_recvs[i]->buf, self_sends[i]->buf, self_sends[i]->count * es);
  ctx.waitAll(reqs);
}

namespace {
double batchCost(double n, int, const TransportParams& t) { return t.alpha + n * t.beta; }
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kP2pBatch, .name = "batch", .fn = p2pBatch, .cost = batchCost});

}  // namespace harp
