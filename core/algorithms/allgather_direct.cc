// Allgather, direct: every rank receives each peer's block straight from that
// peer, and sends its own block from sendbuf to every peer, all at once.
// Nothing is forwarded: on a single-copy transport (shm with CMA) every read
// hits a sender's own input, which it did not just write, where the ring reads
// blocks its left neighbour has just received (cache lines dirty on another
// core). Chosen for shm by core/select/tuning.tsv; on networks the ring's one
// neighbour per step suits links better.
// Any p, any count; in-place when sendbuf == recvbuf + r·count (NCCL's rule);
// a sendbuf inside recvbuf anywhere else is staged in scratch first.
// Cost: alpha + max((p-2)·o + count·beta, (p-1)·count·beta) per rank (o: per-message
// overhead, TransportParams::overhead; the transfers are posted at once, so latencies overlap,
// and each moves while the next is posted; where a line caps each flow below its link
// rate, the p-1 flows share the link: sharedLinkSeconds).
#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {

void allgatherDirect(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(a.sendbuf);
  if (blk == 0) return;
  if (aliasesOtherBlock(in, out, r, p, blk)) {
    char* copy = static_cast<char*>(ctx.scratch(blk));
    copyBytes(copy, in, blk);
    in = copy;
  }
  std::vector<Request*> reqs;
  reqs.reserve(2 * (p - 1));
  for (int s = 1; s < p; ++s) {
    const int from = (r - s + p) % p;
    reqs.push_back(ctx.irecv(from, out + from * blk, blk));
  }
  for (int s = 1; s < p; ++s) reqs.push_back(ctx.isend((r + s) % p, in, blk));
  copyBytes(out + r * blk, in, blk);
  ctx.waitAll(reqs);
}

namespace {
// p-1 concurrent transfers: one latency, then each further message's overhead; together they
// share the rank's link (a line with a per-flow cap: p-1 flows get the link, not p-1 x the cap;
// the leaders' leg of allgather leader, 32 hosts, 8 MB: 83 ms replayed where (p-1)·n·beta said 208).
double directCost(double n, int p, const TransportParams& t) { return burstSeconds(t, p - 1, n * t.beta, sharedLinkSeconds(t, n, p - 1)); }

// Across H hosts of L block-placed ranks: every rank's p-L blocks for other
// hosts leave through its host's uplink at once (L·(p-L)·n), beside its L-1
// blocks inside the host:
//   a_e + max((p-2)·o + n·b_e, L·(p-L)·n·b_e, (L-1)·n·b_i)
// (at 64 ranks, 1 MB, the posting's 62 overheads and the bytes overlap: the sum was 1.7 x the
// replayed time).
double directHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const int H = s.hosts, L = s.local, p = H * L;
  return burstSeconds(ex, p - 1, n * ex.beta,
                      std::max(sharedLinkSeconds(ex, static_cast<double>(p - L) * n, L), (L - 1) * n * in.beta));
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllgather, .name = "direct", .fn = allgatherDirect, .cost = directCost,
                         .flat_hier_cost = directHostsCost});

}  // namespace harp
