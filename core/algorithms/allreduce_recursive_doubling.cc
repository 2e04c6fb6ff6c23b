// Allreduce, recursive doubling: log2(p) steps; in step i every rank swaps its
// whole vector with newrank ^ 2^i and reduces. For small messages, where
// latency (alpha) dominates.
//
// Any p: non-powers of two fold the first 2·rem ranks in pairs (fold.h). Both
// partners reduce the same two vectors; IEEE + and * are commutative, so all
// ranks end bitwise identical.
// Cost (p = 2^k): log2(p)·(alpha + n·beta + n·gamma). p != 2^k adds
// 2·alpha + 2·n·beta + n·gamma.
// Across H hosts of L block-placed ranks (H, L powers of two): the first
// log2(L) rounds pair ranks of one host (i = the intra line), the last log2(H)
// pair hosts with every rank of a host at once, so a host's uplink carries
// L·n per round (e = the inter line):
//   log2(L)·(a_i + n·b_i + n·g_i) + log2(H)·(a_e + L·n·b_e + n·g_e)
// One network hop fewer than the leader algorithm's reduce + leaders + bcast
// for small n; more bytes on the uplink (L·n) for larger n.
#include "core/algorithms/fold.h"

namespace harp {

void allreduceRecursiveDoubling(Context& ctx) {
  const CollArgs& a = ctx.args();
  const size_t es = ctx.elemSize(), bytes = a.count * es;
  char* out = static_cast<char*>(a.recvbuf);
  copyBytes(out, a.sendbuf, bytes);
  if (ctx.size() == 1 || a.count == 0) return;
  char* tmp = static_cast<char*>(ctx.scratch(bytes));

  fold::Fold f = fold::in(ctx, out, tmp, a.count);
  if (f.newrank >= 0) {
    for (int mask = 1; mask < f.pof2; mask <<= 1) {
      const int partner = f.real(f.newrank ^ mask);
      ctx.sendrecv(partner, out, bytes, partner, tmp, bytes);
      // Lower newrank's data first on both sides keeps operands in one order.
      if (f.newrank & mask) reduce(out, tmp, out, a.count, a.dtype, a.op);
      else reduce(out, out, tmp, a.count, a.dtype, a.op);
    }
  }
  fold::out(ctx, f, out, a.count);
}

namespace {
double recursiveDoublingCost(double n, int p, const TransportParams& t) {
  return ceilLog2(floorPow2(p)) * (t.alpha + n * t.beta + n * t.gamma) + fold::cost(n, p, t);
}

double recursiveDoublingHostsCost(double n, const HierShape& s, const TransportParams& in,
                                  const TransportParams& ex) {
  if (floorPow2(s.hosts) != s.hosts || floorPow2(s.local) != s.local)
    return recursiveDoublingCost(n, s.hosts * s.local, ex);  // folds and mixed rounds: every round a network hop
  return ceilLog2(s.local) * (in.alpha + n * in.beta + n * in.gamma) +
         ceilLog2(s.hosts) * (ex.alpha + sharedLinkSeconds(ex, n, s.local) + n * ex.gamma);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "recursive_doubling", .fn = allreduceRecursiveDoubling,
                         .cost = recursiveDoublingCost, .flat_hier_cost = recursiveDoublingHostsCost});

}  // namespace harp
