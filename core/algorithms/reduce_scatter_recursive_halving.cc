// Reduce-scatter, recursive halving (MPICH's commutative algorithm): the input
// is p blocks of `count`; rank r ends with block r reduced (NCCL's layout).
//
// Among the 2^k ranks of the power-of-two phase, step i (mask = 2^(k-1-i))
// exchanges with newrank ^ mask: each keeps the half of its current block
// range on its own side of the mask, sends the other half and reduces the half
// it receives into what it kept. The first step sends straight from the input;
// partial sums live in scratch, so the input is never modified; the last step
// reduces straight into recvbuf.
//
// Non-powers of two: p = 2^k + rem. Rather than restricting to 2^k with a
// fallback to the ring, the extra ranks are folded as in fold.h and
// allreduce_halving_doubling.cc, so any p gets log steps (this is the
// algorithm for small blocks on many hosts, whose counts are rarely powers of
// two): each even rank r < 2·rem sends its whole input (p blocks) to r+1 and
// sits out; the odd rank reduces both and, as newrank r/2, owns the result
// blocks of r-1 and r. Ranks >= 2·rem are newrank r - rem and own block r.
// Newrank j's blocks start at j < rem ? 2j : j + rem, a contiguous range in
// order, so the halving splits block ranges by newrank as for 2^k. At the end
// each odd rank hands block r-1 back. (fold.h itself reduces into the output
// in place, which a reduce-scatter cannot: its input is p blocks, its output
// one; hence the fold is written out here.)
//
// Restriction: commutative op (the halving changes the order of reduction;
// every HARP op is commutative today); fallback "ring". Any count; in place
// when recvbuf == sendbuf + r·count. Scratch: 2p blocks where p != 2^k (fold),
// 1.5p otherwise.
// Cost (p = 2^k): log2 p·alpha + (p-1)·count·(beta + gamma).
// p != 2^k adds 2·alpha + (p+1)·count·beta + p·count·gamma (the fold).
#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp {

void reduceScatterRecursiveHalving(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize(), blk = a.count * es;
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  if (p == 1 || blk == 0) return copyBytes(out, in + r * blk, blk);
  const int pof2 = floorPow2(p), rem = p - pof2;
  const size_t tmp_blocks = rem ? p : p / 2;
  char* acc = static_cast<char*>(ctx.scratch((p + tmp_blocks) * blk));
  char* tmp = acc + p * blk;
  const char* src = in;
  int nr;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      ctx.wait(ctx.isend(r + 1, in, p * blk));
      ctx.wait(ctx.irecv(r + 1, out, blk));  // after the send: out may lie inside in
      return;
    }
    ctx.wait(ctx.irecv(r - 1, tmp, p * blk));
    reduce(acc, in, tmp, p * a.count, a.dtype, a.op);
    src = acc;
    nr = r / 2;
  } else {
    nr = r - rem;
  }
  auto start = [rem](int j) { return static_cast<size_t>(j < rem ? 2 * j : j + rem); };
  auto real = [rem](int j) { return j < rem ? 2 * j + 1 : j + rem; };
  int lo = 0, hi = pof2;
  for (int mask = pof2 / 2; mask >= 1; mask >>= 1) {
    const int partner = real(nr ^ mask), mid = (lo + hi) / 2;
    const bool lower = (nr & mask) == 0;
    const int klo = lower ? lo : mid, khi = lower ? mid : hi;
    const int slo = lower ? mid : lo, shi = lower ? hi : mid;
    const size_t kb = start(klo) * blk, kn = (start(khi) - start(klo)) * blk;
    const size_t sb = start(slo) * blk, sn = (start(shi) - start(slo)) * blk;
    ctx.sendrecv(partner, src + sb, sn, partner, tmp, kn);
    char* dst = mask == 1 && r >= 2 * rem ? out : acc + kb;  // last step, one block: r's
    reduce(dst, src + kb, tmp, kn / es, a.dtype, a.op);
    src = acc;
    lo = klo;
    hi = khi;
  }
  if (r < 2 * rem) {  // odd folded rank: acc holds blocks r-1 and r
    copyBytes(out, acc + r * blk, blk);
    ctx.wait(ctx.isend(r - 1, acc + (r - 1) * blk, blk));
  }
}

namespace {
double recursiveHalvingCost(double n, int p, const TransportParams& t) {
  const int q = floorPow2(p);
  double c = ceilLog2(q) * t.alpha + (p - 1) * n * (t.beta + t.gamma);
  if (q != p) c += 2 * t.alpha + (p + 1) * n * t.beta + p * n * t.gamma;
  return c;
}

// Across H hosts of L block-placed ranks (powers of two): the first log2 H
// rounds (masks >= L) pair hosts with every rank of a host at once, so its
// uplink carries L·(p-L)·n; the last log2 L stay inside a host ((L-1)·n):
//   log2(H)·a_e + L·(p-L)·n·b_e + log2(L)·a_i + (L-1)·n·b_i + (p-1)·n·gamma
double recursiveHalvingHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const int H = s.hosts, L = s.local, p = H * L;
  if (floorPow2(H) != H || floorPow2(L) != L) return recursiveHalvingCost(n, p, ex);
  return ceilLog2(H) * ex.alpha + sharedLinkSeconds(ex, static_cast<double>(p - L) * n, L) + ceilLog2(L) * in.alpha +
         (L - 1) * n * in.beta + (p - 1) * n * ex.gamma;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduceScatter, .name = "recursive_halving",
                         .fn = reduceScatterRecursiveHalving, .restrictions = {.commutative_op = true},
                         .cost = recursiveHalvingCost, .fallback = "ring", .flat_hier_cost = recursiveHalvingHostsCost});

}  // namespace harp
