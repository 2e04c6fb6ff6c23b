// Reduce-scatter, leader (hierarchical, for many hosts and sharded training):
// intra-host reduce of the whole input to the host's
// leader, reduce_scatter of host-sized groups of blocks among the leaders,
// intra-host scatter of the host's blocks to its ranks. Only the leader of
// each host crosses the network. The leader form (not rail) because it works
// on uneven hosts and any placement with the legs that exist (groups are
// padded to the largest host); a rail form (intra reduce_scatter, one rail
// reduce_scatter per local rank) would cut the intra bytes by L but needs
// equal hosts: future work.
//
// Steps, H hosts, L_h ranks on host h, L = max L_h, p ranks, n bytes per
// block (the output), input p·n:
//   1. intra reduce of the p·n input to local rank 0 (the intra
//      communicator's own reduce, shm);
//   2. the leader arranges the sums in host order, H groups of L blocks
//      (group g = the blocks of host g's ranks in local-rank order, padded
//      with zeros to L blocks). With block placement and equal hosts that is
//      the reduced input itself and nothing moves;
//   3. leaders' reduce_scatter of the groups, in place (rail 0, tcp; the
//      leader of host h is rank h there and ends with group h summed);
//   4. intra scatter of group h's blocks from local rank 0.
// A host of one rank skips steps 1 and 4.
//
// Restrictions: >= 2 hosts, a host with >= 2 ranks; fallback ring. The
// partial sums are combined in another order than a flat algorithm's, so the
// op must be commutative (commutative_op; every HARP op is today). Uneven
// hosts and any placement are fine. Any count (0 returns at once on every
// rank), every dtype and op (avg sums; the parent divides, hier::legOp); in
// place (recvbuf == sendbuf + r·n) or not; the input is never modified.
//
// Bytes per host link, each direction: (H-1)·L·n (the leaders' ring), i.e.
// (p-L)·n on equal hosts; the flat ring with block placement carries (p-1)·n
// across every host boundary with p-1 network latencies, leader H-1.
// Uneven hosts send the padding too.
// Cost (intra = shm's line, inter = tcp's; l = ceil(log2 L)), each leg what
// its selector runs there (hier::legSeconds):
//   intra: the host's reduce of p·n bytes and scatter of n-byte blocks on L
//          ranks (binomial reduce l·(a_i + p·n·b_i + p·n·c_i) below 256 KB, the
//          pipeline above; linear scatter a_i + (L-2)·o_i + (L-1)·n·b_i)
//   inter: the leaders' reduce_scatter of L·n-byte groups on H ranks, the
//          cheapest flat algorithm's cost (hier::legSeconds; the ring's is
//          (H-1)·(a_e + L·n·b_e + L·n·c_e))
//   + 3 leg calls (core/algorithms/hier.h).
#include <cstring>

#include "core/algorithms/hier.h"
#include "core/algorithms/registry.h"
#include "core/topology/topology.h"

namespace harp {
namespace {

void reduceScatterLeader(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size();
  const size_t blk = a.count * ctx.elemSize();
  if (blk == 0) return;
  SubComms& s = ctx.subComms();
  const Topology& topo = *s.topo;
  const double t = ctx.timeout();
  const ReduceOp op = hier::legOp(a.op);
  const int H = topo.hosts, h = s.host;
  const size_t L = static_cast<size_t>(topo.max_local), slot = L * blk;
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  if (s.local_rank != 0) {  // the reduce writes only the root's recvbuf; the scatter only this one's
    runOn(*s.intra, CollType::kReduce, in, const_cast<char*>(in), p * a.count, a.dtype, op, 0, t);
    runOn(*s.intra, CollType::kScatter, out, out, a.count, a.dtype, op, 0, t);
    return;
  }
  const bool direct = topo.blocked && topo.uniform();
  char* space = static_cast<char*>(ctx.scratch((direct ? 1 : 2) * H * slot));
  char* sums = space;  // p blocks in rank order
  if (s.intra) runOn(*s.intra, CollType::kReduce, in, sums, p * a.count, a.dtype, op, 0, t);
  else copyBytes(sums, in, p * blk);
  char* groups = sums;  // H groups of L blocks, host order
  if (!direct) {
    groups = space + H * slot;
    for (int g = 0; g < H; ++g) {
      const std::vector<int>& ranks = topo.ranks_of[g];
      for (size_t j = 0; j < ranks.size(); ++j) copyBytes(groups + g * slot + j * blk, sums + ranks[j] * blk, blk);
      const size_t have = ranks.size() * blk;
      if (have < slot) std::memset(groups + g * slot + have, 0, slot - have);
    }
  }
  char* mine = groups + h * slot;
  runOn(*s.rail, CollType::kReduceScatter, groups, mine, L * a.count, a.dtype, op, 0, t);
  if (s.intra) runOn(*s.intra, CollType::kScatter, mine, out, a.count, a.dtype, op, 0, t);
  else copyBytes(out, mine, blk);
}

double leaderCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double L = s.local, p = s.hosts * L;
  const double intra = hier::legSeconds(CollType::kReduce, p * n, s.local, "shm", in) +
                       hier::legSeconds(CollType::kScatter, n, s.local, "shm", in);
  const double inter = hier::legSeconds(CollType::kReduceScatter, L * n, s.hosts, "tcp", ex);
  return intra + inter + 3 * hier::kLegCallS;
}

}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduceScatter, .name = "leader", .fn = reduceScatterLeader,
                         .restrictions = {.commutative_op = true, .min_hosts = 2, .min_local_ranks = 2},
                         .cost = nullptr, .fallback = "ring", .hier_cost = leaderCost});

}  // namespace harp
