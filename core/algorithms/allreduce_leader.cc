// Allreduce, leader (hierarchical, for small messages): intra-host
// reduce to the host's leader (its lowest rank), allreduce among the leaders,
// intra-host broadcast. Open MPI HAN's and Horovod's small-message path.
//
// Steps, H hosts, L ranks on the largest host, n bytes:
//   1. intra reduce to local rank 0 (the intra communicator's algorithm, shm);
//   2. leaders' allreduce, in place (rail 0 = the leaders' communicator, tcp);
//   3. intra broadcast from local rank 0.
// Only one rank per host crosses the network, once: ceil(log2 H) inter-host
// latencies instead of ceil(log2 HL) for the flat recursive doubling.
//
// Restrictions: >= 2 hosts and a host with >= 2 ranks (else it is the flat
// algorithm with extra calls). Uneven hosts are fine (a host of one rank
// skips steps 1 and 3). Any count, in place or not, every dtype and op.
//
// Bytes per host link, each direction: the leaders' allreduce only: n per
// round of recursive doubling (ceil(log2 H)·n) or 2(H-1)/H·n for a ring.
// Cost (intra = shm's line, inter = tcp's; l = ceil(log2 L), h = ceil(log2 H)):
//   intra: the host's reduce and broadcast of n bytes on L ranks (shm), each
//          what its selector runs there (hier::legSeconds: binomial below
//          256 KB, l·(a_i + n·b_i + n·c_i) and l·(a_i + n·b_i); the pipeline above)
//   inter: the leaders' allreduce of n bytes on H ranks, the cheapest flat
//          algorithm's cost (hier::legSeconds: recursive doubling's
//          h·(a_e + n·b_e + n·c_e) for small n, halving-doubling or the ring above)
//   + 3 leg calls (core/algorithms/hier.h).
#include <algorithm>

#include "core/algorithms/hier.h"
#include "core/algorithms/registry.h"
#include "core/topology/topology.h"

namespace harp {
namespace {

void allreduceLeader(Context& ctx) {
  const CollArgs& a = ctx.args();
  const size_t bytes = a.count * ctx.elemSize();
  SubComms& s = ctx.subComms();
  const double t = ctx.timeout();
  const ReduceOp op = hier::legOp(a.op);
  void* out = a.recvbuf;
  if (s.intra) runOn(*s.intra, CollType::kReduce, a.sendbuf, out, a.count, a.dtype, op, 0, t);
  else copyBytes(out, a.sendbuf, bytes);
  if (s.local_rank == 0 && s.rail) runOn(*s.rail, CollType::kAllreduce, out, out, a.count, a.dtype, op, 0, t);
  if (s.intra) runOn(*s.intra, CollType::kBroadcast, out, out, a.count, a.dtype, op, 0, t);
}

double leaderCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double intra = hier::legSeconds(CollType::kReduce, n, s.local, "shm", in) +
                       hier::legSeconds(CollType::kBroadcast, n, s.local, "shm", in);
  return intra + hier::legSeconds(CollType::kAllreduce, n, s.hosts, "tcp", ex) + 3 * hier::kLegCallS;
}

}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "leader", .fn = allreduceLeader,
                         .restrictions = {.min_hosts = 2, .min_local_ranks = 2},
                         .cost = nullptr, .fallback = "recursive_doubling", .hier_cost = leaderCost});

}  // namespace harp
