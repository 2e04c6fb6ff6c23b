// core/algorithms/pat.h — the schedule shared by reduce_scatter `pat` and
// allgather `pat` (NCCL's PAT, "Parallel Aggregated Trees", arXiv 2506.20252):
// one binomial tree per block, all of them translates of one tree, walked so
// that a rank keeps O(log p) messages' worth of partial data, never p blocks.
//
// Offsets. Rank q sees block j at offset s = (q - j) mod p. Block j's tree has
// its root at offset 0 (rank j); offset s > 0 hangs below s - lowbit(s), the
// rank lowbit(s) places below q (lowbit: the lowest set bit). Reduce-scatter
// sends partial sums up this tree, allgather sends the block down it. A rank's
// message to its parent along the edge of length d = lowbit(s) carries several
// blocks at once only where all of them have the same d.
//
// Aggregation. K = ceil(log2 p), P = 2^K; A, a power of two <= P/2, blocks go
// in one message: the offsets are grouped by their low bits, group g (0 <= g < G
// = P/A) holding the offsets a·G + g for a = 0 .. count(g)-1 (those below p).
// All of a group g > 0 has lowbit(g) as its lowest bit, so the group is one
// message on the edge of length lowbit(g): phase I walks the groups g = 1 ..
// G-1 (reduce-scatter from the highest down, so every group's children, the
// higher groups g + 2^m with 2^m < lowbit(g), come before it; allgather from
// the lowest up), one message of count(g) blocks each. Group 0 is itself a
// binomial tree of its A offsets a·G with edges lowbit(a)·G: phase II sends it
// dimension by dimension, one message per dimension j < log2 A carrying the
// offsets with lowbit(a) = 2^j (reduce-scatter after phase I, j rising;
// allgather before it, j falling). A = P/2 gives G = 2 and K messages (one
// phase I group, K-1 dimensions): Bruck's step count. A = 1 gives p-1 messages
// of one block, the ring's count, with the least buffering. NCCL picks its
// aggregation from its step size the same way (aggFactor).
//
// Choice of A: the largest power of two <= P/2 with A·b <= M, M =
// HARP_SEGMENT_BYTES (one message of at most a segment), b the block's bytes
// (reduce-scatter: of one slice, below). So small blocks go in ceil(log2 p)
// messages and a block of more than M/2 goes alone.
//
// Live partial sums (reduce-scatter). With the groups walked from the highest
// down, the ones holding a partial sum while group g is sent are g and its
// ancestors (each group's subtree is the interval [h, h + lowbit(h)), walked
// just before h), whose popcounts differ: one buffer per popcount suffices,
// log2 G of them (a group with children has popcount <= log2 G - 1) plus, for
// A > 1, the popcount log2 G where a leaf group's blocks are gathered into one
// message (for A = 1 a leaf sends its input block in place).
#pragma once

#include <cstddef>

#include "core/algorithms/registry.h"

namespace harp::pat {

inline int lowbit(int x) { return x & -x; }

struct Plan {
  int p = 1, K = 0, P = 1;  // ranks, ceil(log2 p), 2^K
  int A = 1, G = 1, L = 0;  // blocks per message, groups (P/A), log2 G
  // Offsets a·G + g below p: the blocks in group g's message.
  int count(int g) const { return g < p ? (p - 1 - g) / G + 1 : 0; }
  // Offsets a·G of group 0 with lowbit(a) = 2^j (phase II's dimension j).
  int dimCount(int j) const {
    const int c0 = count(0), step = 2 << j;
    return (1 << j) < c0 ? (c0 - 1 - (1 << j)) / step + 1 : 0;
  }
  int dims() const { return K - L; }  // log2 A
  // Messages one rank sends (and receives): phase I's groups with blocks plus
  // phase II's dimensions with blocks.
  int messages() const {
    int m = 0;
    for (int g = 1; g < G; ++g) m += count(g) > 0;
    for (int j = 0; j < dims(); ++j) m += dimCount(j) > 0;
    return m;
  }
  // Blocks reduce-scatter copies for A > 1 (0 for A = 1), one rank: the
  // blocks of a group's message no child's sum covered (gathered from the
  // input; a group's children cover its first count(g+1) blocks when g is
  // even, none when g is odd), the same for group 0 before phase II, and
  // phase II's blocks (gathered from group 0's buffer).
  int gatherCopies() const {
    if (A == 1) return 0;
    auto covered = [&](int g) { return (g % 2 == 0 && g + 1 < G) ? count(g + 1) : 0; };
    int c = count(0) - covered(0);
    for (int g = 1; g < G; ++g) c += count(g) - covered(g);
    for (int j = 0; j < dims(); ++j) c += dimCount(j);
    return c;
  }
};

// The plan for p ranks and b bytes per (slice of a) block, messages of at most
// `msg` bytes (A >= 1 whatever b is).
inline Plan plan(int p, double b, double msg) {
  Plan s;
  s.p = p;
  s.K = ceilLog2(p);
  s.P = 1 << s.K;
  while (s.A * 2 <= s.P / 2 && 2.0 * s.A * b <= msg) s.A *= 2;
  s.G = s.P / s.A;
  s.L = s.K - ceilLog2(s.A);
  return s;
}

// Blocks one rank sends on edges of length >= L: on hosts of L consecutive
// ranks, the messages every rank of a host sends across at once (phase I's
// groups with lowbit(g) >= L, phase II's dimensions with 2^j·G >= L). Each
// block of another host reaches a rank's tree once over such an edge, so for
// a power-of-two L dividing p this is p/L - 1 (63 at 512 ranks of 8).
inline int hostLinkBlocks(const Plan& s, int L) {
  int b = 0;
  for (int g = 1; g < s.G; ++g) b += lowbit(g) >= L ? s.count(g) : 0;
  for (int j = 0; j < s.dims(); ++j) b += (1 << j) * s.G >= L ? s.dimCount(j) : 0;
  return b;
}

// What hosts add to the flat cost (`ex`, one flow per message): the blocks on
// edges of length >= L go all L ranks of a host at once through its link
// (sharedLinkSeconds with L flows), not at one flow's rate. The shorter edges,
// crossed by fewer ranks of a host at a time (or none), are left at the flat
// price. Shared by reduce_scatter and allgather `pat` (flat_hier_cost).
inline double hostLinkExcess(const Plan& s, double n, int L, const TransportParams& ex) {
  if (L < 2) return 0;
  const double extra = sharedLinkSeconds(ex, n, L) - n * ex.beta;
  return extra > 0 ? hostLinkBlocks(s, L) * extra : 0;
}

// Reduce-scatter's scratch, in units of b (one slice of a block): log2 G
// partial-sum buffers of A blocks, one receive buffer of A blocks, and for
// A > 1 the leaves' gathering buffer of A blocks: (L + 1) blocks for A = 1,
// (L + 2)·A for A > 1. So K + 1 blocks for A = 1, and at most (K + 1)·M
// bytes for A > 1 (there A·b <= M and L + 2 <= K + 1).
inline size_t reduceScatterScratchBlocks(const Plan& s) {
  return s.A == 1 ? static_cast<size_t>(s.L + 1) : static_cast<size_t>(s.L + 2) * s.A;
}

}  // namespace harp::pat
