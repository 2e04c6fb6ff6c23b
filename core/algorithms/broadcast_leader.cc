// Broadcast, leader (hierarchical): the root's host first, then the
// hosts' leaders, then every other host.
//
// Steps (H hosts, L ranks on the largest host, n bytes; the legs are the
// sub-communicators' own broadcasts, core/topology/topology.h):
//   1. on the root's host: intra broadcast from the root (its leader included);
//   2. leaders' broadcast (rail 0) from the root host's leader;
//   3. on every other host: intra broadcast from the leader.
// Each host's link carries the data once per leaders' tree level instead of
// once per rank of the host that a flat tree sends across it.
//
// Restrictions: >= 2 hosts and a host with >= 2 ranks; uneven hosts are fine.
// Any root, any count; the root's sendbuf (if not the buffer) is copied first.
// Bytes per host link: n per leaders' tree level (binomial: ceil(log2 H) on the
// root's host at most).
// Cost (intra = shm's line, inter = tcp's; l = ceil(log2 L), h = ceil(log2 H)):
//   2l·(a_i + n·b_i) + h·(a_e + n·b_e) + 3 leg calls (core/algorithms/hier.h).
#include "core/algorithms/hier.h"
#include "core/algorithms/registry.h"
#include "core/topology/topology.h"

namespace harp {
namespace {

void broadcastLeader(Context& ctx) {
  const CollArgs& a = ctx.args();
  char* buf = static_cast<char*>(a.recvbuf);
  if (ctx.rank() == a.root && a.sendbuf) copyBytes(buf, a.sendbuf, a.count * ctx.elemSize());
  SubComms& s = ctx.subComms();
  const double t = ctx.timeout();
  const int root_host = s.topo->host_of.at(a.root), root_local = s.topo->local_rank_of.at(a.root);
  auto intra = [&](int root) {
    if (s.intra) runOn(*s.intra, CollType::kBroadcast, buf, buf, a.count, a.dtype, ReduceOp::kSum, root, t);
  };
  auto leaders = [&] {
    if (s.local_rank == 0 && s.rail)
      runOn(*s.rail, CollType::kBroadcast, buf, buf, a.count, a.dtype, ReduceOp::kSum, root_host, t);
  };
  if (s.host == root_host) {
    intra(root_local);
    leaders();
  } else {
    leaders();
    intra(0);
  }
}

double leaderCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double l = ceilLog2(s.local), h = ceilLog2(s.hosts);
  return 2 * l * (in.alpha + n * in.beta) + h * (ex.alpha + n * ex.beta) + 3 * hier::kLegCallS;
}

}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kBroadcast, .name = "leader", .fn = broadcastLeader,
                         .restrictions = {.min_hosts = 2, .min_local_ranks = 2},
                         .cost = nullptr, .fallback = "binomial", .hier_cost = leaderCost});

}  // namespace harp
