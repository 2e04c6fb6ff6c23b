// Alltoall, Bruck's algorithm (small blocks, many ranks): ceil(log2 p)
// messages per rank instead of p-1, at the price of sending each block up to
// ceil(log2 p) times. Steps, with tmp = p blocks of scratch:
//   1. local rotation: tmp[i] = block (r + i) mod p of sendbuf (the block for
//      rank r + i);
//   2. for k = 0 .. ceil(log2 p)-1: pack the blocks tmp[i] whose index i has
//      bit k set, send them to rank r + 2^k and receive as many from rank
//      r - 2^k, unpacked into the same positions (after step k, tmp[i] holds
//      the block from rank r - (i mod 2^(k+1)) for rank r + i - (i mod 2^(k+1)));
//   3. inverse rotation: recvbuf block (r - i) mod p = tmp[i].
// Any p; in place (sendbuf == recvbuf) works as is (sendbuf is read into tmp
// before recvbuf is written); count 0 moves nothing. Scratch: (p + 2m)·n bytes,
// m = the largest number of blocks one step sends (about p/2).
// Cost: sum over k of (alpha + m_k·n·beta), m_k = #{0 < i < p : bit k of i}
// (ceil(log2 p)·alpha + about (p/2)·ceil(log2 p)·n·beta), plus 2 local copies
// of p·n bytes (rotations) and 2 of m_k·n per step (pack, unpack). Bytes sent
// per rank: n·sum m_k (p a power of two: n·(p/2)·log2 p; pairwise: n(p-1)).
// On hosts of consecutive ranks a step's packs share the host's uplink, and only
// the copies at the two ends of the path count (bruckHostsCost).
#include <algorithm>

#include "core/algorithms/registry.h"

namespace harp {
namespace {
// Blocks 0 < i < p with bit `bit` set: runs [i, i + bit) starting at bit, 3·bit, ...
template <typename F>
void forRuns(int p, int bit, F f) {
  for (int i = bit; i < p; i += 2 * bit) f(i, std::min(bit, p - i));
}
size_t blocksAt(int p, int bit) {
  size_t m = 0;
  forRuns(p, bit, [&](int, int len) { m += len; });
  return m;
}
}  // namespace

void alltoallBruck(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t blk = a.count * ctx.elemSize();
  const char* in = static_cast<const char*>(a.sendbuf);
  char* out = static_cast<char*>(a.recvbuf);
  if (!blk) return;
  if (p == 1) {
    copyBytes(out, in, blk);
    return;
  }
  size_t most = 0;
  for (int bit = 1; bit < p; bit <<= 1) most = std::max(most, blocksAt(p, bit));
  char* tmp = static_cast<char*>(ctx.scratch((p + 2 * most) * blk));
  char* spack = tmp + p * blk;
  char* rpack = spack + most * blk;
  // 1. tmp[i] = in[(r + i) mod p]
  copyBytes(tmp, in + r * blk, (p - r) * blk);
  copyBytes(tmp + (p - r) * blk, in, r * blk);
  // 2. step k: the blocks with bit k set go 2^k ranks on
  for (int bit = 1; bit < p; bit <<= 1) {
    size_t off = 0;
    forRuns(p, bit, [&](int i, int len) {
      copyBytes(spack + off, tmp + i * blk, len * blk);
      off += len * blk;
    });
    ctx.sendrecv((r + bit) % p, spack, off, (r - bit + p) % p, rpack, off);
    off = 0;
    forRuns(p, bit, [&](int i, int len) {
      copyBytes(tmp + i * blk, rpack + off, len * blk);
      off += len * blk;
    });
  }
  // 3. out[(r - i) mod p] = tmp[i]
  for (int i = 0; i < p; ++i) copyBytes(out + ((r - i + p) % p) * blk, tmp + i * blk, blk);
}

namespace {
// The local copies (at gamma, the per-byte local-memory figure TransportParams has): both
// rotations (2p blocks) and every step's pack and unpack (2·m_k), each on every rank's path.
double bruckCost(double n, int p, const TransportParams& t) {
  double c = 2.0 * p * n * t.gamma;
  for (int bit = 1; bit < p; bit <<= 1) {
    const double m = static_cast<double>(blocksAt(p, bit)) * n;
    c += t.alpha + m * t.beta + 2 * m * t.gamma;
  }
  return c;
}

// On H hosts of L consecutive ranks: step k's partner is 2^k ranks on, so for 2^k < L only
// the last 2^k ranks of a host send across and from 2^k >= L every one does, all at once
// through the host's uplink: min(2^k, L)·m_k·n there per step, against m_k·n inside a host.
// (At 128 ranks on 16 hosts, 8 KB blocks: the uplinks carry 39 packs of 64 blocks, where
// pairwise sends each block once; simulated, Bruck 8.5 ms against pairwise 3.9.)
// Copies: the two rotations, the first step's pack and the last step's unpack are on the
// path (before the first send, after the last receive); the packs and unpacks between are
// done while the host's other ranks hold its link. (Replayed at 512 ranks, 2 KB blocks,
// 100 us: 11.20 ms, against 10.19 modelled without the copies and 11.24 with them.)
double bruckHostsCost(double n, const HierShape& s, const TransportParams& in, const TransportParams& ex) {
  const int L = s.local, p = s.hosts * L;
  const int top = floorPow2(p - 1);  // the last step's bit
  double c = (2.0 * p + static_cast<double>(blocksAt(p, 1) + blocksAt(p, top))) * n * ex.gamma;
  for (int bit = 1; bit < p; bit <<= 1) {
    const double m = static_cast<double>(blocksAt(p, bit)) * n;
    c += ex.alpha + std::max(sharedLinkSeconds(ex, m, std::min(bit, L)), m * in.beta);
  }
  return c;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAlltoall, .name = "bruck", .fn = alltoallBruck, .cost = bruckCost,
                         .flat_hier_cost = bruckHostsCost});

}  // namespace harp
