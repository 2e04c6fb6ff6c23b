// Coalesced allreduce, ring ("ring"): the allreduce of a list of buffers
// (CollArgs::pieces, one dtype and op) in one schedule, without packing them
// into one buffer and unpacking the result (no flatten/unflatten copies;
// Horovod's tensor fusion and torch's bucket views copy twice).
//
// Steps: every piece is cut into p blocks the way the flat ring cuts its one
// vector (sizes differ by at most one element). Reduce-scatter: in step s
// (0..p-2) rank r sends block (r-s) mod p of every piece to its right
// neighbour and receives block (r-s-1) mod p of every piece from its left
// into scratch, reducing each into the piece's receive buffer as soon as it
// has arrived and forwarding it at once, so steps overlap on the wire as the
// flat ring's do. Blocks travel in segments of HARP_SEGMENT_BYTES at most, and
// the reduce-scatter receives go to a window of 4 segment slots that stays in
// cache (the flat ring's scheme), however long the list. After p-1 steps rank r
// holds the reduced block (r+1) mod p of every piece. Allgather: in step s
// rank r forwards block (r+1-s) mod p of every piece and receives block
// (r-s) mod p straight into the receive buffers. A block of a piece is one
// message per segment; empty blocks (pieces shorter than p elements) are
// skipped by both sides. Out of place, step 0 sends from the send buffers and every reduction
// reads them (as the flat ring does): no piece is copied first.
//
// Restrictions: none (any p, any count, any op the dtype allows; integer avg
// is refused by Communicator::validate). Results are bitwise identical on all
// ranks: each block is reduced along the ring once, then copied.
// Cost: 2(p-1)·m·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma for m pieces
// holding n bytes: the flat ring's bytes, with m messages per step instead of
// one, and 2(p-1) synchronising steps for the list instead of 2(p-1) per piece.
#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"
#include "base/reduce.h"

namespace harp {

void allreduceCoalescedRing(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize();
  if (p == 1 || a.count == 0) {
    for (const BufPiece& b : a.pieces)
      if (b.recv != b.send) copyBytes(b.recv, b.send, b.count * es);
    return;
  }

  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  const size_t m = a.pieces.size();
  std::vector<Blocks> blocks;
  blocks.reserve(m);
  for (const BufPiece& b : a.pieces) blocks.push_back(Blocks{b.count, static_cast<size_t>(p)});
  auto at = [&](size_t i, int c) { return static_cast<char*>(a.pieces[i].recv) + blocks[i].offset(c) * es; };
  auto src = [&](size_t i, int c) { return static_cast<const char*>(a.pieces[i].send) + blocks[i].offset(c) * es; };

  // A unit: one message, a segment (HARP_SEGMENT_BYTES at most) of one piece's block.
  struct Unit {
    uint32_t piece;
    int block;
    size_t off, n;  // elements, within the block
  };
  const size_t seg = std::max<size_t>(1, ctx.segmentBytes() / es);
  auto unitsOf = [&](int c, std::vector<Unit>& out) {  // block c of every piece, in piece order
    for (size_t i = 0; i < m; ++i)
      for (size_t off = 0, n = blocks[i].size(c); off < n; off += seg)
        out.push_back({static_cast<uint32_t>(i), c, off, std::min(seg, n - off)});
  };
  std::vector<Unit> rs;  // every reduce-scatter receive, step by step
  for (int s = 0; s < p - 1; ++s) unitsOf(mod(r - s - 1), rs);

  // Reduce-scatter receives land in a small ring of segment slots that stays
  // in cache (as the flat ring's): a receive is posted kWindow units ahead of
  // the reduction that consumes it.
  constexpr size_t kWindow = 4;
  const size_t slots = std::min(kWindow, std::max<size_t>(1, rs.size()));
  char* tmp = static_cast<char*>(ctx.scratch(slots * seg * es));
  auto slot = [&](size_t u) { return tmp + (u % slots) * seg * es; };
  std::vector<Request*> sends, recvs(rs.size(), nullptr);
  for (size_t u = 0; u < std::min(slots, rs.size()); ++u) recvs[u] = ctx.irecv(left, slot(u), rs[u].n * es);
  // Step 0 sends this rank's own block of every piece, from the input.
  std::vector<Unit> own;
  unitsOf(r, own);
  for (const Unit& x : own) sends.push_back(ctx.isend(right, src(x.piece, r) + x.off * es, x.n * es));
  for (size_t u = 0; u < rs.size(); ++u) {
    const Unit& x = rs[u];
    ctx.wait(recvs[u]);
    char* dst = at(x.piece, x.block) + x.off * es;
    reduce(dst, src(x.piece, x.block) + x.off * es, slot(u), x.n, a.dtype, a.op);
    if (u + slots < rs.size()) recvs[u + slots] = ctx.irecv(left, slot(u + slots), rs[u + slots].n * es);
    // Forward at once: the next step's send of this segment (after the last
    // step: allgather step 0's, the block this rank now holds reduced).
    sends.push_back(ctx.isend(right, dst, x.n * es));
  }
  // Allgather: every step's blocks are distinct, so all receives go up at once.
  std::vector<Unit> ag;
  for (int s = 0; s < p - 1; ++s) unitsOf(mod(r - s), ag);
  std::vector<Request*> agr(ag.size());
  for (size_t u = 0; u < ag.size(); ++u) agr[u] = ctx.irecv(left, at(ag[u].piece, ag[u].block) + ag[u].off * es, ag[u].n * es);
  const int last = mod(r - (p - 2));  // the block received in the last step is not forwarded
  for (size_t u = 0; u < ag.size(); ++u) {
    ctx.wait(agr[u]);
    if (ag[u].block != last) sends.push_back(ctx.isend(right, at(ag[u].piece, ag[u].block) + ag[u].off * es, ag[u].n * es));
  }
  // A send's buffer is not written again before it completes: a block comes
  // back round the ring only after the right neighbour has used this rank's send.
  ctx.waitAll(sends);
}

// Cost: the flat ring's with one piece (the pieces' count is not in the cost
// signature; the only candidate, so nothing is compared with it).
HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduceCoalesced, .name = "ring", .fn = allreduceCoalescedRing,
                         .cost = ringAllreduceCost});

}  // namespace harp
