// Alltoall and alltoallv, pairwise exchange: every rank posts a receive from
// and a send to every other rank (in order r+1, r+2, ... so that no single
// rank is hit by everyone first), copies its own block locally, and waits.
// In-place (sendbuf == recvbuf) stages the input in scratch first.
// Cost: alpha + max((p-2)·o + count·beta, (p-1)·count·beta) per rank, o the
// per-message overhead (TransportParams::overhead): the p-1 messages are posted
// at once, so their latencies overlap, each further one adds only its software
// cost (on a loopback line o = alpha, which gives (p-1)·alpha), and each moves
// while the next is posted (burstSeconds). Where a line caps each flow below its
// link rate, the p-1 flows share the link: (p-1)·count·beta becomes
// count·max(beta, (p-1)·link_beta) (sharedLinkSeconds).
#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"

namespace harp {
namespace {
void exchange(Context& ctx, const char* in, char* out, const std::vector<size_t>& soff,
              const std::vector<size_t>& slen, const std::vector<size_t>& roff, const std::vector<size_t>& rlen,
              size_t in_bytes) {
  const int p = ctx.size(), r = ctx.rank();
  if (in == out && in_bytes) {
    char* copy = static_cast<char*>(ctx.scratch(in_bytes));
    copyBytes(copy, in, in_bytes);
    in = copy;
  }
  std::vector<Request*> reqs;
  for (int s = 1; s < p; ++s) {
    const int from = (r - s + p) % p;
    reqs.push_back(ctx.irecv(from, out + roff[from], rlen[from]));
  }
  for (int s = 1; s < p; ++s) {
    const int to = (r + s) % p;
    reqs.push_back(ctx.isend(to, in + soff[to], slen[to]));
  }
  copyBytes(out + roff[r], in + soff[r], std::min(slen[r], rlen[r]));
  ctx.waitAll(reqs);
}
}  // namespace

void alltoallPairwise(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size();
  const size_t blk = a.count * ctx.elemSize();
  std::vector<size_t> off(p), len(p, blk);
  for (int q = 0; q < p; ++q) off[q] = q * blk;
  exchange(ctx, static_cast<const char*>(a.sendbuf), static_cast<char*>(a.recvbuf), off, len, off, len, p * blk);
}

void alltoallvPairwise(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size();
  const size_t es = ctx.elemSize();
  std::vector<size_t> so(p), sl(p), ro(p), rl(p);
  size_t in_bytes = 0;
  for (int q = 0; q < p; ++q) {
    so[q] = a.sdispls[q] * es;
    sl[q] = a.sendcounts[q] * es;
    ro[q] = a.rdispls[q] * es;
    rl[q] = a.recvcounts[q] * es;
    in_bytes = std::max(in_bytes, so[q] + sl[q]);
  }
  if (sl[ctx.rank()] != rl[ctx.rank()])
    throw InvalidArgument("alltoallv: this rank sends " + std::to_string(a.sendcounts[ctx.rank()]) +
                          " elements to itself but expects " + std::to_string(a.recvcounts[ctx.rank()]));
  exchange(ctx, static_cast<const char*>(a.sendbuf), static_cast<char*>(a.recvbuf), so, sl, ro, rl, in_bytes);
}

namespace {
double pairwiseCost(double n, int p, const TransportParams& t) { return burstSeconds(t, p - 1, n * t.beta, sharedLinkSeconds(t, n, p - 1)); }

// On H hosts of L consecutive ranks every block to another host crosses its uplink once, all
// L ranks' at once: L·(p-L)·n there, (L-1)·n inside the host.
double pairwiseHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const double L = s.local, p = s.hosts * L;
  return burstSeconds(ex, static_cast<int>(p) - 1, n * ex.beta,
                      std::max(sharedLinkSeconds(ex, (p - L) * n, L), (L - 1) * n * in.beta));
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAlltoall, .name = "pairwise", .fn = alltoallPairwise, .cost = pairwiseCost,
                         .flat_hier_cost = pairwiseHostsCost});
HARP_REGISTER_ALGORITHM({.coll = CollType::kAlltoallv, .name = "pairwise", .fn = alltoallvPairwise, .cost = pairwiseCost});

}  // namespace harp
