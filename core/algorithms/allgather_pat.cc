// Allgather, PAT (Parallel Aggregated Trees, NCCL 2.23+, arXiv 2506.20252):
// the mirror of reduce_scatter `pat`, the same trees walked the other way.
// Block j goes down a binomial tree rooted at rank j: rank q, holding j at
// offset s = q - j (mod p), receives it from q - lowbit(s) and passes it on to
// q + 2^m for every m below s's lowest bit. Offsets sharing their low bits form
// a group whose blocks travel in one message of up to A blocks
// (core/algorithms/pat.h has the schedule):
//  1. rank q's own block to recvbuf block q (a move: sendbuf may lie anywhere
//     inside recvbuf);
//  2. phase II, dimensions j = log2 A - 1 down to 0 (P = 2^ceil(log2 p), G =
//     P/A): the blocks at offsets a·G with lowbit(a) = 2^j arrive from
//     q - 2^j·G, while this rank sends q + 2^j·G the ones at offsets
//     (a - 2^j)·G, which it already has;
//  3. phase I, groups g = 1 .. G-1: group g's blocks (offsets a·G + g) arrive
//     from q - lowbit(g), while this rank sends q + lowbit(g) its group
//     g - lowbit(g).
// Every block arrives once and is final, so it is received straight into
// recvbuf and sent from there: with A = 1 (a block of more than half a
// segment) there is no intermediate buffer at all, and p - 1 messages of one
// block; with A > 1 a message's blocks are strided in recvbuf and pass
// through a gathering and a receive buffer of A blocks each, A·n <= one
// segment: scratch <= 2·HARP_SEGMENT_BYTES whatever p (Bruck: p blocks, up to
// 16 segments). A, the blocks per message, is the largest power of two <= P/2
// with A·n <= HARP_SEGMENT_BYTES: ceil(log2 p) messages for small blocks.
// Any p, any count, in place (sendbuf == recvbuf + q·count) or sendbuf
// anywhere else, inside recvbuf or not.
// Cost: m·alpha + (p-1)·count·beta + (1 + 2c)·count·gamma, m = the plan's
// messages (ceil(log2 p) for A = P/2, p - 1 for A = 1), c = the blocks that
// travel in messages of more than one block (each gathered and scattered
// once; 0 for A = 1), 1 = the own block's move. HARP_SEGMENT_BYTES at its
// default 512 KiB. On hosts (flat_hier_cost) plus pat::hostLinkExcess: the
// p/L - 1 blocks that all L ranks of a host send across at once share its link.
#include "core/algorithms/pat.h"
#include "core/algorithms/registry.h"

namespace harp {

void allgatherPat(Context& ctx) {
  const CollArgs& args = ctx.args();
  const int p = ctx.size(), q = ctx.rank();
  const size_t blk = args.count * ctx.elemSize();
  char* out = static_cast<char*>(args.recvbuf);
  if (blk == 0) return;
  copyBytes(out + q * blk, args.sendbuf, blk);  // memmove: sendbuf may overlap block q
  if (p == 1) return;
  const pat::Plan s = pat::plan(p, static_cast<double>(blk), static_cast<double>(ctx.segmentBytes()));
  char* gather = nullptr;
  char* tmp = nullptr;
  if (s.A > 1) {
    gather = static_cast<char*>(ctx.scratch(2 * s.A * blk));
    tmp = gather + s.A * blk;
  }
  auto block = [&](int off) { return out + static_cast<size_t>((q - off % p + p) % p) * blk; };
  // c blocks: send the ones at offsets sent(0..c-1) to `to`, receive the ones at offsets got(0..c-1) from `from`.
  auto exchange = [&](int c, int to, auto sent, int from, auto got) {
    if (c == 1) return ctx.sendrecv(to, block(sent(0)), blk, from, block(got(0)), blk);
    for (int i = 0; i < c; ++i) copyBytes(gather + i * blk, block(sent(i)), blk);
    ctx.sendrecv(to, gather, c * blk, from, tmp, c * blk);
    for (int i = 0; i < c; ++i) copyBytes(block(got(i)), tmp + i * blk, blk);
  };
  for (int j = s.dims() - 1; j >= 0; --j) {  // phase II
    const int m = s.dimCount(j), dist = (1 << j) * s.G;
    if (m == 0) continue;
    exchange(m, (q + dist) % p, [&](int i) { return (i << (j + 1)) * s.G; }, (q - dist + p) % p,
             [&](int i) { return ((2 * i + 1) << j) * s.G; });
  }
  for (int g = 1; g < s.G; ++g) {  // phase I
    const int c = s.count(g), d = pat::lowbit(g);
    if (c == 0) continue;
    exchange(c, (q + d) % p, [&](int i) { return i * s.G + g - d; }, (q - d + p) % p,
             [&](int i) { return i * s.G + g; });
  }
}

namespace {
double patCost(double n, int p, const TransportParams& t) {
  const pat::Plan s = pat::plan(p, n, kDefaultSegmentBytes);
  int packed = 0;  // blocks in messages of more than one block
  for (int g = 1; g < s.G; ++g) packed += s.count(g) > 1 ? s.count(g) : 0;
  for (int j = 0; j < s.dims(); ++j) packed += s.dimCount(j) > 1 ? s.dimCount(j) : 0;
  return s.messages() * t.alpha + (p - 1) * n * t.beta + (1 + 2 * packed) * n * t.gamma;
}

// On hosts of L consecutive ranks: the flat cost over the host link plus pat::hostLinkExcess.
double patHostsCost(double n, const HierShape& sh, const TransportParams&, const TransportParams& ex) {
  const int p = sh.hosts * sh.local;
  return patCost(n, p, ex) + pat::hostLinkExcess(pat::plan(p, n, kDefaultSegmentBytes), n, sh.local, ex);
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllgather, .name = "pat", .fn = allgatherPat, .cost = patCost,
                         .flat_hier_cost = patHostsCost});

}  // namespace harp
