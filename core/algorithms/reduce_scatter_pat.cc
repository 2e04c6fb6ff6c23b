// Reduce-scatter, PAT (Parallel Aggregated Trees, NCCL 2.23+, arXiv
// 2506.20252): the dimension-reversed Bruck reduce-scatter for any p, walked
// so that the partial sums a rank holds take O(log p) buffers of one message
// each, never the p blocks that Bruck's rotated buffer holds. The input is p
// blocks of `count`; rank q ends with block q reduced (NCCL's layout).
//
// Steps (core/algorithms/pat.h has the schedule): block j is reduced up a
// binomial tree rooted at rank j in which rank q, holding j at offset s = q - j
// (mod p), adds the sums from ranks q + 2^m (m below s's lowest bit) to its own
// input block and sends the result to q - lowbit(s). Offsets sharing their low
// bits form a group whose blocks travel in one message of up to A blocks:
//  1. phase I, groups g = G-1 down to 1 (G = P/A, P = 2^ceil(log2 p)): send
//     group g's sums to q - lowbit(g), receive the sums for group g - lowbit(g)
//     from q + lowbit(g) and reduce them into that group's buffer (with the
//     input block where no earlier child's sum is there yet);
//  2. phase II, dimensions j = 0 .. log2 A - 1: group 0's offsets a·G with
//     lowbit(a) = 2^j go to q - 2^j·G in one message, the ones arriving from
//     q + 2^j·G are reduced into offsets (a - 2^j)·G.
// The last reduction into offset 0 (block q) writes recvbuf. A, the blocks per
// message, is the largest power of two <= P/2 with A·b <= HARP_SEGMENT_BYTES:
// ceil(log2 p) messages for small blocks (Bruck's count), p-1 messages of one
// block each once a block passes half a segment (the ring's).
//
// Buffers (scratch; the property the algorithm exists for): partial sums live
// in one buffer per popcount of the group (the groups holding one at a time
// are a chain of tree ancestors), so with L = log2 G: A = 1, (L + 1) = K + 1
// blocks (K = ceil(log2 p)): L sums and one receive buffer; A > 1, (L + 2)·A
// blocks, each message at most one segment: at most (K + 1)·HARP_SEGMENT_BYTES.
// A block larger than a segment is cut into slices of a segment, the whole
// schedule run once per slice (more messages, large blocks only), so the
// scratch never exceeds (K + 1)·max(HARP_SEGMENT_BYTES, element size) bytes,
// against 1.5·p blocks (up to 16 segments) for `bruck`. tests/test_algos_pat.py
// checks the bound through resident memory.
//
// Restriction: commutative op (each block's sum is taken in tree order);
// fallback "ring". Any p, any count; in place when recvbuf == sendbuf +
// q·count; the input is never modified.
// Cost: m·alpha + (p-1)·count·(beta + gamma) + c·count·gamma, m = the
// messages of the plan (ceil(log2 p) for A = P/2, p - 1 for A = 1) times the
// slices, c = the blocks gathered into messages for A > 1 (about p for A = P/2,
// Bruck's rotation; 0 for A = 1). HARP_SEGMENT_BYTES at its default 512 KiB.
// On hosts (flat_hier_cost) plus pat::hostLinkExcess: the p/L - 1 blocks that
// all L ranks of a host send across at once share its link.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/reduce.h"
#include "core/algorithms/pat.h"
#include "core/algorithms/registry.h"

namespace harp {

void reduceScatterPat(Context& ctx) {
  const CollArgs& args = ctx.args();
  const int p = ctx.size(), q = ctx.rank();
  const size_t es = ctx.elemSize(), blk = args.count * es;
  const char* in = static_cast<const char*>(args.sendbuf);
  char* out = static_cast<char*>(args.recvbuf);
  if (p == 1 || blk == 0) return copyBytes(out, in + q * blk, blk);
  const size_t seg = ctx.segmentBytes();
  const size_t slice = blk <= seg ? args.count : std::max<size_t>(1, seg / es);
  const pat::Plan s = pat::plan(p, static_cast<double>(slice * es), static_cast<double>(seg));
  const size_t room = slice * es * s.A;  // one buffer: A blocks of a slice
  char* base = static_cast<char*>(ctx.scratch(pat::reduceScatterScratchBlocks(s) * slice * es));
  // Buffers by popcount (L of them; A > 1: L + 1, the last for leaves' messages), then the receive buffer.
  char* tmp = base + (s.A == 1 ? s.L : s.L + 1) * room;
  auto buffer = [&](int g) { return base + __builtin_popcount(static_cast<unsigned>(g)) * room; };
  int last_dim = -1;  // phase II's last dimension with blocks: it finishes block q
  for (int j = 0; j < s.dims(); ++j)
    if (s.dimCount(j) > 0) last_dim = j;
  std::vector<int> filled(s.G);  // group g's buffer holds sums for its first filled[g] blocks
  for (size_t s0 = 0; s0 < args.count; s0 += slice) {
    const size_t n = std::min(slice, args.count - s0), nb = n * es, at = s0 * es;
    std::fill(filled.begin(), filled.end(), 0);
    // This slice of the input block at offset `off` (block q - off).
    auto input = [&](int off) { return in + static_cast<size_t>((q - off % p + p) % p) * blk + at; };
    // Reduce c arriving blocks into group h's buffer; `finish`: block q's last sum goes to recvbuf.
    auto absorb = [&](int h, int c, bool finish) {
      char* dst = buffer(h);
      for (int x = 0; x < c; ++x) {
        const char* mine = x < filled[h] ? dst + x * nb : input(x * s.G + h);
        char* to = finish && h == 0 && x == 0 ? out + at : dst + x * nb;
        reduce(to, mine, tmp + x * nb, n, args.dtype, args.op);
      }
      filled[h] = std::max(filled[h], c);
    };
    // Phase I.
    for (int g = s.G - 1; g >= 1; --g) {
      const int c = s.count(g);
      if (c == 0) continue;
      const int d = pat::lowbit(g);
      const char* msg;
      if (s.A == 1) {
        msg = filled[g] ? buffer(g) : input(g);  // a leaf sends its input block as it is
      } else {
        char* b = buffer(g);
        for (int x = filled[g]; x < c; ++x) copyBytes(b + x * nb, input(x * s.G + g), nb);
        msg = b;
      }
      ctx.sendrecv((q - d + p) % p, msg, c * nb, (q + d) % p, tmp, c * nb);
      absorb(g - d, c, g == 1 && last_dim < 0);
    }
    if (s.A == 1) continue;
    // Phase II: group 0's tree, dimension by dimension; slot 1 (unused now) gathers each message.
    char* root = buffer(0);
    char* gather = base + room;
    const int c0 = s.count(0);
    for (int x = filled[0]; x < c0; ++x) copyBytes(root + x * nb, input(x * s.G), nb);
    for (int j = 0; j < s.dims(); ++j) {
      const int m = s.dimCount(j);
      if (m == 0) continue;
      const int dist = (1 << j) * s.G;
      for (int i = 0; i < m; ++i) copyBytes(gather + i * nb, root + static_cast<size_t>((2 * i + 1) << j) * nb, nb);
      ctx.sendrecv((q - dist + p) % p, gather, m * nb, (q + dist) % p, tmp, m * nb);
      for (int i = 0; i < m; ++i) {
        const size_t x = static_cast<size_t>(i) << (j + 1);
        char* to = x == 0 && j == last_dim ? out + at : root + x * nb;
        reduce(to, root + x * nb, tmp + i * nb, n, args.dtype, args.op);
      }
    }
  }
}

namespace {
double patCost(double n, int p, const TransportParams& t) {
  constexpr double kSegment = kDefaultSegmentBytes;
  const double slices = n > kSegment ? std::ceil(n / kSegment) : 1;
  const pat::Plan s = pat::plan(p, std::min(n, kSegment), kSegment);
  return slices * s.messages() * t.alpha + (p - 1) * n * (t.beta + t.gamma) + s.gatherCopies() * n * t.gamma;
}

// On hosts of L consecutive ranks: the flat cost over the host link plus pat::hostLinkExcess.
double patHostsCost(double n, const HierShape& sh, const TransportParams&, const TransportParams& ex) {
  constexpr double kSegment = kDefaultSegmentBytes;
  const int p = sh.hosts * sh.local;
  return patCost(n, p, ex) + pat::hostLinkExcess(pat::plan(p, std::min(n, kSegment), kSegment), n, sh.local, ex);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kReduceScatter, .name = "pat", .fn = reduceScatterPat,
                         .restrictions = {.commutative_op = true}, .cost = patCost, .fallback = "ring",
                         .flat_hier_cost = patHostsCost});

}  // namespace harp
