// Allreduce, rail (hierarchical): intra-host reduce-scatter over
// shared memory, one inter-host allreduce per local rank at once (each rail
// its own sockets), intra-host allgather. UCC's split_rail, NCCL's
// tree-of-rings idea, Horovod's hierarchical allreduce.
//
// Steps, with H hosts of L ranks each, local rank i, n bytes:
//   1. intra reduce_scatter (the intra communicator's own algorithm, shm): the
//      first c = floor(count/L)·L elements cut into L blocks of c; rank i
//      ends with block i summed over its host;
//   2. rail allreduce (the rail communicator's own algorithm, tcp): block i
//      summed over the hosts, in place; the L rails of a host run at once;
//   3. intra allgather: every block to every rank of the host.
//   The count % L tail elements (fewer than L) go through an intra allreduce
//   and a rail allreduce instead (every rail repeats that tiny sum).
// The legs are the sub-communicators' ordinary collectives (Context::subComms,
// core/topology/topology.h), so each runs the algorithm its own selector picks.
// Pipelined above 8 x HARP_SEGMENT_BYTES (4 MB): the main region is cut into
// pieces of about that size, each reduce-scattered, rail-allreduced and
// allgathered; piece k's rail allreduce runs on the rail communicator's worker
// thread (async submit) while this thread reduce-scatters piece k+1 and
// allgathers piece k-1 over shm, so the shm legs hide behind the network leg.
//
// Restrictions: >= 2 hosts, a host with >= 2 ranks, the same rank count on
// every host (uneven hosts would cut the vector differently per host, so the
// rails would not line up): fallback ring. Any count, in place or not, every
// dtype and op (avg sums; the parent divides).
//
// Bytes per host link, one NIC per host, each direction: the L rails carry
// 2·(H-1)/H·(n/L) each, 2·(H-1)/H·n together; the flat ring (ranks of a host
// adjacent) carries 2·(p-1)/p·n with p = H·L. Ratio (p-1)/p / ((H-1)/H): 1.5 at
// 2 hosts x 2, 1.17 at 4 x 2, 1.75 at 2 x 4. busbw (2(p-1)/p·n/t) can thus
// reach (p-1)/p / ((H-1)/H) of the link rate.
// Cost (intra = shm's line, inter = tcp's), per piece of m bytes (m = n, or
// 8 x HARP_SEGMENT_BYTES when pipelined: k = ceil(n / m) pieces), each leg the
// cheapest flat algorithm of its sub-communicator (hier::legSeconds):
//   intra: reduce_scatter + allgather of m/L-byte blocks on L ranks (shm)
//   inter: allreduce of m/L bytes on H ranks (tcp), each rail with 1/L of the
//          host link (link_beta x L; at most one flow's beta): the rails' calls say so
//          (CollOptions::link_flows = L), so each rail's selector picks for that share too
//          (at 1 ms, 16 hosts, 512 KB: halving-doubling; for a whole flow's rate it picked
//          recursive doubling, 1.2 x slower at 1/8 of the link); a rail's latencies are paid once per piece,
//          since one worker thread runs the pieces' rail calls one by one
//   total: intra + inter + (k-1)·max(intra, inter) (the pipeline) + 3k leg calls.
// At 1 ms RTT and 8 hosts a 256 MB call is 64 pieces of 14 ring latencies
// (or 6 of halving-doubling) each: the latency that once per call is noise
// is then a third of the call (docs/scale-projection.md).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/algorithms/hier.h"
#include "core/algorithms/registry.h"
#include "core/topology/topology.h"

namespace harp {
namespace {

// Pieces of the main region (c·L elements), each cut into L blocks: piece k
// runs reduce_scatter, rail allreduce, allgather. The rail allreduce of piece k
// runs on the rail communicator's worker thread (an async submit) while this
// thread reduce-scatters piece k+1 and allgathers piece k-1 over shm.
constexpr size_t kPieceSegments = 8;  // a piece is 8 x HARP_SEGMENT_BYTES (4 MB by default)

// The rail allreduce of one piece, asynchronous; the host's L rails run at once (link_flows).
std::shared_ptr<Work> railAsync(Group& rail, char* buf, size_t count, const CollArgs& a, ReduceOp op,
                                double t, size_t L) {
  CollArgs r;
  r.coll = CollType::kAllreduce;
  r.sendbuf = r.recvbuf = buf;
  r.count = count;
  r.dtype = a.dtype;
  r.op = op;
  r.opts.timeout_s = t;
  r.opts.link_flows = static_cast<int>(L);
  return rail.submit(std::move(r), true);
}

void pipelined(Context& ctx, SubComms& s, size_t c, size_t L, ReduceOp op) {
  const CollArgs& a = ctx.args();
  const size_t es = ctx.elemSize(), i = static_cast<size_t>(s.local_rank);
  const double t = ctx.timeout();
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  const size_t piece = std::max<size_t>(1, ctx.segmentBytes() * kPieceSegments / es / L);  // block elements
  const Blocks parts{c, (c + piece - 1) / piece};
  std::vector<std::shared_ptr<Work>> works(parts.n);
  auto mine = [&](size_t k) { return out + (L * parts.offset(k) + i * parts.size(k)) * es; };
  auto gather = [&](size_t k) {
    works[k]->wait();
    runOn(*s.intra, CollType::kAllgather, mine(k), out + L * parts.offset(k) * es, parts.size(k), a.dtype, op, 0, t);
  };
  try {
    for (size_t k = 0; k < parts.n; ++k) {
      const size_t at = L * parts.offset(k) * es;
      runOn(*s.intra, CollType::kReduceScatter, in + at, mine(k), parts.size(k), a.dtype, op, 0, t);
      works[k] = railAsync(*s.rail, mine(k), parts.size(k), a, op, t, L);
      if (k > 0) gather(k - 1);
    }
    gather(parts.n - 1);
  } catch (...) {
    // Nothing may still write into the caller's buffer once this returns.
    s.rail->abort("rail allreduce failed on this rank");
    for (auto& w : works) {
      try {
        if (w) w->wait(t);
      } catch (...) {  // the error this rank raises is the first one
      }
    }
    throw;
  }
}

void allreduceRail(Context& ctx) {
  const CollArgs& a = ctx.args();
  const size_t es = ctx.elemSize();
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  SubComms& s = ctx.subComms();
  const double t = ctx.timeout();
  const ReduceOp op = hier::legOp(a.op);
  const size_t L = s.intra ? static_cast<size_t>(s.intra->size()) : 1;
  const size_t c = a.count / L, tail = a.count - c * L, i = s.local_rank;
  if (c > 0 && s.intra && s.rail && c * L * es > ctx.segmentBytes() * kPieceSegments) {
    pipelined(ctx, s, c, L, op);
  } else if (c > 0) {
    char* mine = out + i * c * es;
    if (s.intra) runOn(*s.intra, CollType::kReduceScatter, in, mine, c, a.dtype, op, 0, t);
    else copyBytes(mine, in, c * es);
    if (s.rail) runOn(*s.rail, CollType::kAllreduce, mine, mine, c, a.dtype, op, 0, t, static_cast<int>(L));
    if (s.intra) runOn(*s.intra, CollType::kAllgather, mine, out, c, a.dtype, op, 0, t);
  }
  if (tail > 0) {
    const size_t at = c * L * es;
    if (s.intra) runOn(*s.intra, CollType::kAllreduce, in + at, out + at, tail, a.dtype, op, 0, t);
    else copyBytes(out + at, in + at, tail * es);
    if (s.rail) runOn(*s.rail, CollType::kAllreduce, out + at, out + at, tail, a.dtype, op, 0, t, static_cast<int>(L));
  }
}

constexpr double kDefaultPieceBytes = static_cast<double>(kPieceSegments * kDefaultSegmentBytes);

double railCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double L = s.local;
  const double pieces = n > kDefaultPieceBytes ? std::ceil(n / kDefaultPieceBytes) : 1;
  const double block = n / pieces / L;
  const TransportParams rail = sharedBy(ex, s.local);  // L rails share the host's link, as their calls say
  const double intra = hier::legSeconds(CollType::kReduceScatter, block, s.local, "shm", in) +
                       hier::legSeconds(CollType::kAllgather, block, s.local, "shm", in);
  const double inter = hier::legSeconds(CollType::kAllreduce, block, s.hosts, "tcp", rail);
  return intra + inter + (pieces - 1) * std::max(intra, inter) + 3 * pieces * hier::kLegCallS;
}

}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "rail", .fn = allreduceRail,
                         .restrictions = {.min_hosts = 2, .min_local_ranks = 2, .uniform_hosts = true},
                         .cost = nullptr, .fallback = "ring", .hier_cost = railCost});

}  // namespace harp
