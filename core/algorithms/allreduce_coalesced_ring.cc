// Coalesced allreduce, ring ("ring"): the allreduce of a list of buffers
// (CollArgs::pieces, one dtype and op) in one schedule, without packing them
// into one buffer and unpacking the result (no flatten/unflatten copies;
// Horovod's tensor fusion and torch's bucket views copy twice).
//
// Steps: every piece is cut into p blocks the way the flat ring cuts its one
// vector (sizes differ by at most one element). Reduce-scatter: in step s
// (0..p-2) rank r sends block (r-s) mod p of every piece to its right
// neighbour and receives block (r-s-1) mod p of every piece from its left
// into scratch (two halves: the next step's receives are posted before this
// step's are reduced), reducing each into the piece's receive buffer as soon
// as it has arrived and forwarding it at once, so steps overlap on the wire
// as the flat ring's segments do. After p-1 steps rank r
// holds the reduced block (r+1) mod p of every piece. Allgather: in step s
// rank r forwards block (r+1-s) mod p of every piece and receives block
// (r-s) mod p straight into the receive buffers. A block of a piece is one
// message; empty blocks (pieces shorter than p elements) are skipped by both
// sides. Out of place, step 0 sends from the send buffers and every reduction
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
#include "core/base/reduce.h"

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
  size_t widest = 0;  // elements of one step's receives (the largest block of every piece)
  for (const BufPiece& b : a.pieces) {
    blocks.push_back(Blocks{b.count, static_cast<size_t>(p)});
    widest += blocks.back().size(0);
  }
  // Two halves: the receives of step s+1 are posted while step s is reduced.
  char* tmp = static_cast<char*>(ctx.scratch(2 * widest * es));
  auto at = [&](size_t i, int c) { return static_cast<char*>(a.pieces[i].recv) + blocks[i].offset(c) * es; };
  auto src = [&](size_t i, int c) { return static_cast<const char*>(a.pieces[i].send) + blocks[i].offset(c) * es; };

  std::vector<Request*> sends;
  std::vector<std::vector<Request*>> recvs(2);  // by half: one per piece (nullptr: empty block)
  std::vector<std::vector<char*>> staged(2);
  auto postRs = [&](int s) {  // reduce-scatter step s's receives, block (r-s-1) of every piece
    const int c = mod(r - s - 1), h = s & 1;
    recvs[h].assign(m, nullptr);
    staged[h].assign(m, nullptr);
    size_t used = 0;
    for (size_t i = 0; i < m; ++i) {
      const size_t n = blocks[i].size(c);
      if (n == 0) continue;
      staged[h][i] = tmp + (h * widest + used) * es;
      recvs[h][i] = ctx.irecv(left, staged[h][i], n * es);
      used += n;
    }
  };
  // Reduce-scatter step 0 sends this rank's own block of every piece, from the input.
  postRs(0);
  for (size_t i = 0; i < m; ++i)
    if (blocks[i].size(r)) sends.push_back(ctx.isend(right, src(i, r), blocks[i].size(r) * es));
  for (int s = 0; s < p - 1; ++s) {
    if (s + 1 < p - 1) postRs(s + 1);
    const int c = mod(r - s - 1), h = s & 1;
    for (size_t i = 0; i < m; ++i) {
      if (!recvs[h][i]) continue;
      ctx.wait(recvs[h][i]);
      reduce(at(i, c), src(i, c), staged[h][i], blocks[i].size(c), a.dtype, a.op);
      // Forward at once: the next step's send of this piece (after the last
      // step: allgather step 0's, the block this rank now holds reduced).
      sends.push_back(ctx.isend(right, at(i, c), blocks[i].size(c) * es));
    }
  }
  // Allgather: every step's blocks are distinct, so all receives go up at once.
  std::vector<std::vector<Request*>> ag(p - 1, std::vector<Request*>(m, nullptr));
  for (int s = 0; s < p - 1; ++s) {
    const int c = mod(r - s);
    for (size_t i = 0; i < m; ++i)
      if (blocks[i].size(c)) ag[s][i] = ctx.irecv(left, at(i, c), blocks[i].size(c) * es);
  }
  for (int s = 0; s < p - 1; ++s) {
    const int c = mod(r - s);
    for (size_t i = 0; i < m; ++i) {
      if (!ag[s][i]) continue;
      ctx.wait(ag[s][i]);
      if (s < p - 2) sends.push_back(ctx.isend(right, at(i, c), blocks[i].size(c) * es));
    }
  }
  // A send's buffer is not written again before it completes: a block comes
  // back round the ring only after the right neighbour has used this rank's send.
  ctx.waitAll(sends);
}

namespace {
// The flat ring's cost with one message per piece per step; the pieces'
// count is not in the cost signature, so this is the one-piece figure (the
// only candidate: nothing is compared with it).
double coalescedRingCost(double n, int p, const TransportParams& t) {
  const double f = (p - 1.0) / p;
  return 2 * (p - 1) * t.alpha + 2 * f * n * t.beta + f * n * t.gamma;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduceCoalesced, .name = "ring", .fn = allreduceCoalescedRing,
                         .cost = coalescedRingCost});

}  // namespace harp
