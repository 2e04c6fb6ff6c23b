// Allreduce, ring (reduce-scatter then allgather), segmented and pipelined.
//
// The vector is cut into p chunks (sizes differ by at most one element) and
// run through the ring pattern (core/algorithms/ring.h): in p-1 reduce-scatter
// steps each rank sends one chunk to its right neighbour and reduces the chunk
// arriving from its left into its own copy; after them rank r holds the full
// reduction of chunk (r+1) mod p. p-1 allgather steps then circulate the
// reduced chunks. Each chunk travels in segments (HARP_SEGMENT_BYTES): a
// segment is forwarded as soon as it is reduced, so the next step's sends
// overlap this step's reductions and receives.
//
// Any p >= 1, any count (chunks may be empty), in-place or not; results are
// bitwise identical on all ranks (each chunk is reduced by one rank, then copied).
// Cost: 2(p-1)·alpha·s + 2·(p-1)/p·n·beta + (p-1)/p·n·gamma, with s segments
// per chunk (pipelining hides most of the per-segment alpha for large n).
// Bandwidth-optimal; latency grows with p, so the tuning table uses it for
// large messages.
#include <algorithm>

#include "core/algorithms/ring.h"

namespace harp {

void allreduceRing(Context& ctx) {
  const CollArgs& a = ctx.args();
  ringAllreduce(ctx, Blocks{a.count, static_cast<size_t>(ctx.size())});
}

// 2(p-1) steps of n/p bytes (segments overlap: counted once), one reduction of n(p-1)/p.
double ringAllreduceCost(double n, int p, const TransportParams& t) {
  const double f = (p - 1.0) / p;
  return 2 * (p - 1) * t.alpha + 2 * f * n * t.beta + f * n * t.gamma;
}

// On H hosts of L consecutive ranks (p = H·L), the ring's hops are L-1 inside a
// host for each one between hosts. A rank's step waits only for its left
// neighbour's previous step, so a small call's critical path is 2(p-1)
// consecutive hops, H of every p crossing hosts; a large one runs at the host
// link, which carries one flow of 2(p-1)/p·n each way, and its reductions
// overlap the transfers (a segment is reduced while the next one travels):
//   2(p-1)·(H·a_e + (p-H)·a_i)/p + max(2(p-1)/p·n·max(b_e, b_i), (p-1)/p·n·c_e)
// (the flat cost prices every hop at the slower line: at 64 ranks on 8 hosts,
// 1 ms RTT, 8 bytes, 67 ms against the 11-12 ms simulated).
double ringAllreduceHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double H = s.hosts, p = H * s.local, f = (p - 1) / p;
  const double hop = (H * ex.alpha + (p - H) * in.alpha) / p;
  return 2 * (p - 1) * hop + std::max(2 * f * n * std::max(ex.beta, in.beta), f * n * ex.gamma);
}

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "ring", .fn = allreduceRing, .cost = ringAllreduceCost,
                         .flat_hier_cost = ringAllreduceHostsCost});

}  // namespace harp
