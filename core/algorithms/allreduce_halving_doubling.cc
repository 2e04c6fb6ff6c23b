// Allreduce, halving-doubling (Rabenseifner): recursive-halving reduce-scatter,
// then recursive-doubling allgather.
//
// Among the 2^k ranks of the power-of-two phase, step i (mask = 2^(k-1-i))
// exchanges half of the currently owned block range with newrank ^ mask: the
// lower partner keeps the lower half, reduces the half it receives into it,
// and passes on the other half. After k steps newrank j owns block j fully
// reduced; k doubling steps exchange owned ranges back until everyone has all.
// Blocks are the vector cut into 2^k near-equal parts, so any count works.
//
// Any p: non-powers of two fold the first 2·rem ranks in pairs (fold.h).
// Bitwise identical results on all ranks (each block reduced by one rank).
// Cost (p = 2^k): 2·log2(p)·alpha + 2·(p-1)/p·n·beta + (p-1)/p·n·gamma.
// p != 2^k adds 2·alpha + 2·n·beta + n·gamma. Mid-size messages.
// Across hosts of block-placed ranks: halvingDoublingHostsCost below.
#include "core/algorithms/fold.h"

namespace harp {

void allreduceHalvingDoubling(Context& ctx) {
  const CollArgs& a = ctx.args();
  const size_t es = ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  copyBytes(out, a.sendbuf, a.count * es);
  if (ctx.size() == 1 || a.count == 0) return;
  char* tmp = static_cast<char*>(ctx.scratch(a.count * es));

  fold::Fold f = fold::in(ctx, out, tmp, a.count);
  if (f.newrank >= 0) {
    const Blocks b{a.count, static_cast<size_t>(f.pof2)};
    auto off = [&](int blk) { return b.offset(blk) * es; };
    int lo = 0, hi = f.pof2;
    for (int mask = f.pof2 / 2; mask >= 1; mask >>= 1) {
      const int partner = f.real(f.newrank ^ mask), mid = (lo + hi) / 2;
      const bool lower = (f.newrank & mask) == 0;
      const int klo = lower ? lo : mid, khi = lower ? mid : hi;
      const int slo = lower ? mid : lo, shi = lower ? hi : mid;
      ctx.sendrecv(partner, out + off(slo), off(shi) - off(slo), partner, tmp, off(khi) - off(klo));
      reduce(out + off(klo), out + off(klo), tmp, b.offset(khi) - b.offset(klo), a.dtype, a.op);
      lo = klo;
      hi = khi;
    }
    for (int mask = 1; mask < f.pof2; mask <<= 1) {
      const int partner = f.real(f.newrank ^ mask), w = hi - lo;
      const int plo = (f.newrank & mask) ? lo - w : hi, phi = plo + w;
      ctx.sendrecv(partner, out + off(lo), off(hi) - off(lo), partner, out + off(plo), off(phi) - off(plo));
      lo = std::min(lo, plo);
      hi = std::max(hi, phi);
    }
  }
  fold::out(ctx, f, out, a.count);
}

namespace {
double halvingDoublingCost(double n, int p, const TransportParams& t) {
  const int q = floorPow2(p);
  const double f = (q - 1.0) / q;
  return 2 * ceilLog2(q) * t.alpha + 2 * f * n * t.beta + f * n * t.gamma + fold::cost(n, p, t);
}

// Across H hosts of L block-placed ranks (H, L powers of two): the halving's
// first log2 H rounds (masks >= L) pair hosts with every rank of a host at
// once, exchanging n/2, n/4, ..., n/H; the last log2 L stay inside a host
// (n/2H ... n/p); the doubling mirrors them. A host's uplink carries
// L·(H-1)/H·n each way per phase:
//   2·log2(H)·a_e + 2·L·(H-1)/H·n·b_e + 2·log2(L)·a_i + 2·(L-1)/L·(n/H)·b_i + (p-1)/p·n·gamma
// (measured by the simulator, docs/scale-projection.md: at 8 ranks per host
// 7 x the ring's time at 256 MB, where the flat formula says 1 x).
double halvingDoublingHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const int H = s.hosts, L = s.local;
  if (floorPow2(H) != H || floorPow2(L) != L) return halvingDoublingCost(n, H * L, ex);
  const double g = (H - 1.0) / H, f = (L - 1.0) / L, p = static_cast<double>(H) * L;
  return 2 * ceilLog2(H) * ex.alpha + sharedLinkSeconds(ex, 2 * g * n, L) + 2 * ceilLog2(L) * in.alpha + 2 * f * (n / H) * in.beta +
         (p - 1) / p * n * ex.gamma;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "halving_doubling", .fn = allreduceHalvingDoubling,
                         .cost = halvingDoublingCost, .flat_hier_cost = halvingDoublingHostsCost});

}  // namespace harp
