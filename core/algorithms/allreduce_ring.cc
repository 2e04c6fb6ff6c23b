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
// neighbour's previous step, so the host link's step s waits for the previous
// host link's step s-L plus the L-1 hops between them: one step of the host
// link every max(b_e, (a_e + b_e + (L-1)·(a_i + b_i) [+ L·g])/L), where b_e and
// b_i move a chunk (n/p bytes) between and inside hosts and g reduces one (the
// reduce-scatter's steps: each hop of the chain reduces before it forwards):
//   (p-1)·(rs + ag) + a_e,  rs = max(b, (chain + L·g)/L),  ag = max(b, chain/L),
//   chain = a_e + b_e + (L-1)·(a_i + b_i),  b = max(b_e, b_i)
// Small calls: 2(p-1)·(a_e + (L-1)·a_i)/L, H of every p hops paying the host
// latency. Large ones: 2(p-1)/p·n·b_e, the host link streaming one chunk after
// another with latencies and reductions hidden behind it. (Replayed in SimGrid,
// 64-256 ranks, 16 MB, RTT 0.1 and 1 ms: within 1% at all six points; the sum of
// the latency and bandwidth terms was 1.13-1.40 x the replay, results/sim.)
double ringAllreduceHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double L = s.local, p = s.hosts * L;
  const double be = n / p * ex.beta, bi = n / p * in.beta, g = n / p * ex.gamma, b = std::max(be, bi);
  const double chain = ex.alpha + be + (L - 1) * (in.alpha + bi);
  const double rs = std::max(b, (chain + L * g) / L), ag = std::max(b, chain / L);
  return (p - 1) * (rs + ag) + ex.alpha;
}

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "ring", .fn = allreduceRing, .cost = ringAllreduceCost,
                         .flat_hier_cost = ringAllreduceHostsCost});

}  // namespace harp
