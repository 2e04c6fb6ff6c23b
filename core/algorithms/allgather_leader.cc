// Allgather, leader (hierarchical, for many hosts and sharded training):
// intra-host gather of the host's blocks to its leader
// (lowest rank), allgather of per-host packs among the leaders, intra-host
// broadcast of the whole result. Only the leader of each host crosses the
// network. The leader form (not rail) because it works on uneven hosts with
// the legs that exist (no allgatherv: packs are padded to the largest host),
// and because it keeps one network stream per host; a rail form (each rail
// allgathers its block between hosts, then an intra allgather) would spread
// the same bytes over several sockets but needs equal hosts: future work.
//
// Steps, H hosts, L_h ranks on host h, L = max L_h, p ranks, n bytes per rank:
//   1. intra gather of the host's blocks to local rank 0 (the intra
//      communicator's own gather, shm), into slot h of a pack buffer of
//      H x L x n (slot h = host h's blocks in local-rank order, padded to L);
//   2. leaders' allgather of the L x n packs, in place (rail 0, tcp; the
//      leader of host h is rank h there);
//   3. the leader permutes host order into global rank order in recvbuf
//      (block j of slot h is rank ranks_of[h][j]; ranks of a host need not be
//      consecutive). With block placement and equal hosts host order is rank
//      order: the pack buffer is recvbuf itself and there is nothing to move;
//   4. intra broadcast of the p x n result from local rank 0.
// A host of one rank skips steps 1 and 4.
//
// Restrictions: >= 2 hosts, a host with >= 2 ranks (else it is the flat
// algorithm with extra calls); fallback ring. Uneven hosts and any placement
// are fine. Any count (0 returns at once on every rank), every dtype; in place
// (sendbuf == recvbuf + r·n) or not, and sendbuf anywhere else inside recvbuf
// (the pack buffer is then scratch, read before recvbuf is written).
//
// Bytes per host link, each direction: (H-1)·L·n (the leaders' ring), i.e.
// (p-L)·n on equal hosts; the flat ring with block placement carries (p-1)·n
// across every host boundary and pays p-1 network latencies, leader H-1.
// Uneven hosts send the padding too: (H-1)·L·n with L the largest host.
// Cost (intra = shm's line, inter = tcp's; l = ceil(log2 L)), each leg what
// its selector runs there (hier::legSeconds):
//   intra: the host's gather of n-byte blocks and broadcast of p·n bytes on L
//          ranks (linear gather: a_i + (L-2)·o_i + (L-1)·n·b_i; binomial
//          broadcast l·(a_i + p·n·b_i) below 256 KB, the pipeline above)
//   inter: the leaders' allgather of L·n-byte packs on H ranks, the cheapest
//          flat algorithm's cost (hier::legSeconds; the ring's is (H-1)·(a_e + L·n·b_e))
//   + 3 leg calls (core/algorithms/hier.h).
#include <cstring>

#include "core/algorithms/hier.h"
#include "core/algorithms/registry.h"
#include "core/topology/topology.h"

namespace harp {
namespace {

void allgatherLeader(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  if (blk == 0) return;
  SubComms& s = ctx.subComms();
  const Topology& topo = *s.topo;
  const double t = ctx.timeout();
  const int H = topo.hosts, h = s.host;
  const size_t L = static_cast<size_t>(topo.max_local), slot = L * blk;
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  if (s.local_rank == 0) {
    // Host order is rank order with block placement and equal hosts: gather and
    // allgather straight into recvbuf, unless sendbuf sits in another block there.
    const bool direct = topo.blocked && topo.uniform() && !aliasesOtherBlock(in, out, r, p, blk);
    char* pack = direct ? out : static_cast<char*>(ctx.scratch(H * slot));
    char* mine = pack + h * slot;
    if (s.intra) runOn(*s.intra, CollType::kGather, in, mine, a.count, a.dtype, a.op, 0, t);
    else copyBytes(mine, in, blk);
    // Padding of smaller hosts travels but is never read; zero it so no
    // uninitialised bytes go on the wire.
    const size_t have = static_cast<size_t>(topo.ranks_of[h].size()) * blk;
    if (have < slot) std::memset(mine + have, 0, slot - have);
    runOn(*s.rail, CollType::kAllgather, mine, pack, L * a.count, a.dtype, a.op, 0, t);
    if (!direct) {
      for (int g = 0; g < H; ++g) {
        const std::vector<int>& ranks = topo.ranks_of[g];
        for (size_t j = 0; j < ranks.size(); ++j) copyBytes(out + ranks[j] * blk, pack + g * slot + j * blk, blk);
      }
    }
  } else {
    // Non-roots' recvbuf is not used by the gather.
    runOn(*s.intra, CollType::kGather, in, out, a.count, a.dtype, a.op, 0, t);
  }
  if (s.intra) runOn(*s.intra, CollType::kBroadcast, out, out, p * a.count, a.dtype, a.op, 0, t);
}

double leaderCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double L = s.local, p = s.hosts * L;
  const double intra = hier::legSeconds(CollType::kGather, n, s.local, "shm", in) +
                       hier::legSeconds(CollType::kBroadcast, p * n, s.local, "shm", in);
  const double inter = hier::legSeconds(CollType::kAllgather, L * n, s.hosts, "tcp", ex);
  return intra + inter + 3 * hier::kLegCallS;
}

}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllgather, .name = "leader", .fn = allgatherLeader,
                         .restrictions = {.min_hosts = 2, .min_local_ranks = 2},
                         .cost = nullptr, .fallback = "ring", .hier_cost = leaderCost});

}  // namespace harp
