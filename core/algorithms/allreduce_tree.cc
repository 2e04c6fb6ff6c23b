// Allreduce, pipelined double binary tree (NCCL's "tree" for any p): the
// vector is cut in two halves; half 0 is reduced up and broadcast down tree A,
// half 1 over tree B at the same time, each in segments so that every level
// of a tree works at once.
//
// Trees: A is the in-order binary tree over ranks 1..p-1 (a rank's lowest set
// bit b gives its subtree (r - b, r + b); children r - b/2 and the largest
// r + b/2^k below p), hung under rank 0, which has one child. Leaves of A are
// the odd ranks. B is A on virtual ranks v = p-1-r (p even, a mirror) or
// v = r-1 mod p (p odd, a shift), so a leaf of A is an inner rank of B and the
// reverse: each rank sends and receives about 2n in all, like the ring, but
// over depth d = ceil(log2 p) hops instead of p - 1.
//
// Steps: segment j of a tree is reduced by a rank of depth e at step
// j + D - e (D = ceil(log2 p) bounds every depth: leaves first, the root last)
// and forwarded at step j + D + e + 1 (the root first): R — wait for the
// children's segment j, reduce it into recvbuf, send the sum to the parent —
// and D — wait for the parent's final segment j, send it to the children. A
// message sent at step m is waited for at step m + 1, so in steady state every
// level of both trees moves one segment per step, and no step waits for a later
// one (nothing deadlocks). Each rank sends in its step order and posts its
// receives, a window ahead, in each sender's step order, so the per-pair FIFO
// of every transport matches them even where two ranks are linked in both
// trees (p = 2, 4, ...).
// Results: the root of each tree computes its half and broadcasts it, so every
// rank ends bitwise identical.
// Any p, any count, in place or not. Scratch: a ring of 2D + 6 segment
// buffers per child (4 children at most), bounded by the message.
// Cost, s segments per half (n/2 over HARP_SEGMENT_BYTES, but at least 2d of
// at least 16 KiB, so medium messages pipeline too):
//   (s + 2d)·alpha + (1 + 2d/s)·(2n·beta + n·gamma)
// Latency like halving-doubling's 2·log2 p for any p (no fold), bandwidth like
// the ring's 2n; medium messages on many ranks at long round trips.
// On H hosts of L consecutive ranks most tree edges stay inside a host; those
// that cross carry n/2 each way, on connections of their own. With σ = n/(2s),
// x = the most host-crossing edges on a path to a root, and E = the most
// crossing edge ends at one host (both trees; 6 from 32 ranks of 8 per host):
//   2·(x·(a_e + σ·b_e) + (d-x)·(a_i + σ·b_i)) + 2d·σ·c                  filling
//   + s·(max(shared(E flows of σ), 4σ·b_i, a_e + σ·b_e) + σ·c)       each step
// (shared: the host link's rate for its E flows together, none above b_e; a
// step waits for its neighbours' messages of the step before: a_e + σ·b_e
// where any edge crosses hosts, which binds at long round trips). The
// flat cost prices every hop at the host line and every byte at one flow's rate;
// at 64-128 ranks of 8 per host it was 2-2.5 x the replayed times.
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "base/reduce.h"
#include "core/algorithms/registry.h"

namespace harp {

namespace {

struct TreeLinks {
  int parent = -1;
  int child[2] = {-1, -1};
};

// The in-order binary tree on 0..p-1 described above, for virtual rank v.
TreeLinks inorderTree(int v, int p) {
  TreeLinks t;
  if (p <= 1) return t;
  auto children = [p](int u, int out[2]) {
    out[0] = out[1] = -1;
    if (u == 0) {
      out[0] = floorPow2(p - 1);
      return;
    }
    const int b = u & -u;
    if (b >= 2) out[0] = u - b / 2;
    for (int q = b / 2; q >= 1; q /= 2)
      if (u + q < p) {
        out[1] = u + q;
        break;
      }
  };
  children(v, t.child);
  // Parent: descend from the root, going left below a node and right above it.
  int cur = 0, up = -1;
  while (cur != v) {
    int c[2];
    children(cur, c);
    up = cur;
    cur = (cur == 0 || v < cur) ? c[0] : c[1];
    if (cur < 0) return t;  // unreachable for 0 <= v < p
  }
  t.parent = up;
  return t;
}

// Tree t (0 = A, 1 = B) in real ranks, for real rank r.
TreeLinks treeOf(int t, int r, int p) {
  if (t == 0) return inorderTree(r, p);
  auto toV = [p](int x) { return p % 2 == 0 ? p - 1 - x : (x - 1 + p) % p; };
  auto toR = [p](int v) { return p % 2 == 0 ? p - 1 - v : (v + 1) % p; };
  TreeLinks v = inorderTree(toV(r), p), out;
  if (v.parent >= 0) out.parent = toR(v.parent);
  for (int c = 0; c < 2; ++c)
    if (v.child[c] >= 0) out.child[c] = toR(v.child[c]);
  return out;
}

// Depth of rank r in tree t (the root: 0).
long depthIn(int t, int r, int p) {
  long d = 0;
  for (TreeLinks x = treeOf(t, r, p); x.parent >= 0; x = treeOf(t, x.parent, p)) ++d;
  return d;
}

// Segments per half: HARP_SEGMENT_BYTES pieces, but at least 2d (down to 16 KiB
// pieces) so that a medium message still fills the tree's levels at once.
size_t treeSegments(double half_bytes, int d, size_t seg_bytes) {
  const double by_seg = std::ceil(half_bytes / static_cast<double>(std::max<size_t>(seg_bytes, 1)));
  const double fill = std::min<double>(2.0 * d, std::ceil(half_bytes / (16 << 10)));
  return static_cast<size_t>(std::max({1.0, by_seg, fill}));
}

}  // namespace

void allreduceTree(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize();
  char* out = static_cast<char*>(a.recvbuf);
  copyBytes(out, a.sendbuf, a.count * es);
  if (p == 1 || a.count == 0) return;

  const Blocks halves{a.count, 2};
  const long dmax = ceilLog2(p);  // no rank is deeper in either tree
  const size_t s = treeSegments(static_cast<double>(halves.size(0) * es), static_cast<int>(dmax), ctx.segmentBytes());
  const TreeLinks tree[2] = {treeOf(0, r, p), treeOf(1, r, p)};
  long depth[2];
  for (int t = 0; t < 2; ++t) depth[t] = depthIn(t, r, p);
  auto seg = [&](int t) { return Blocks{halves.size(t), s}; };
  auto segOff = [&](int t, size_t j) { return halves.offset(t) + seg(t).offset(j); };
  auto segLen = [&](int t, size_t j) { return seg(t).size(j); };
  // The step at which a rank of depth dep takes segment j: its reduce R (leaves first,
  // the root last) and its forward D (the root first). A message sent at step m is
  // waited for at step m + 1.
  auto stepR = [&](long dep, size_t j) { return static_cast<long>(j) + dmax - dep; };
  auto stepD = [&](long dep, size_t j) { return static_cast<long>(j) + dmax + dep + 1; };
  const long steps = static_cast<long>(s) + 2 * dmax + 2;

  // Receives are posted `window` sender steps ahead, in the sender's order on each pair;
  // a child's segments land in a ring of window + 2 segment buffers.
  const long window = 2 * dmax + 4;
  const size_t slots = std::min(s, static_cast<size_t>(window) + 2);
  const size_t seg_max = seg(0).size(0) * es;
  size_t need = 0, base[2][2] = {};
  for (int t = 0; t < 2; ++t)
    for (int c = 0; c < 2; ++c)
      if (tree[t].child[c] >= 0) base[t][c] = need, need += slots * seg_max;
  char* tmp = static_cast<char*>(ctx.scratch(std::max<size_t>(need, 1)));
  auto childBuf = [&](int t, int c, size_t j) { return tmp + base[t][c] + (j % slots) * seg_max; };

  std::vector<Request*> up_recv[2][2], down_recv[2];
  for (int t = 0; t < 2; ++t) {
    for (int c = 0; c < 2; ++c) up_recv[t][c].assign(s, nullptr);
    down_recv[t].assign(s, nullptr);
  }
  // Segment j of step m for a sender of depth dep, or -1.
  auto segAt = [&](long m, long first) { return m >= first && m - first < static_cast<long>(s) ? m - first : -1; };
  // Receives of the messages senders send at step m: a child (depth + 1) its R, the parent (depth - 1) its D.
  auto postFor = [&](long m) {
    for (int t = 0; t < 2; ++t) {
      long j = segAt(m, stepR(depth[t] + 1, 0));
      if (j >= 0 && segLen(t, j))
        for (int c = 0; c < 2; ++c)
          if (tree[t].child[c] >= 0)
            up_recv[t][c][j] = ctx.irecv(tree[t].child[c], childBuf(t, c, j), segLen(t, j) * es);
    }
    for (int t = 0; t < 2; ++t) {
      long j = tree[t].parent >= 0 ? segAt(m, stepD(depth[t] - 1, 0)) : -1;
      if (j >= 0 && segLen(t, j))
        down_recv[t][j] = ctx.irecv(tree[t].parent, out + segOff(t, j) * es, segLen(t, j) * es);
    }
  };
  long posted = 0;  // sender steps whose receives are posted
  std::vector<Request*> sends;
  for (long k = 0; k < steps; ++k) {
    for (; posted < steps && posted <= k + window; ++posted) postFor(posted);
    for (int t = 0; t < 2; ++t) {  // R: the children's sums of segment j into mine, mine to the parent
      long j = segAt(k, stepR(depth[t], 0));
      if (j < 0 || !segLen(t, j)) continue;
      char* mine = out + segOff(t, j) * es;
      for (int c = 0; c < 2; ++c)
        if (tree[t].child[c] >= 0) {
          ctx.wait(up_recv[t][c][j]);
          reduce(mine, mine, childBuf(t, c, j), segLen(t, j), a.dtype, a.op);
        }
      if (tree[t].parent >= 0) sends.push_back(ctx.isend(tree[t].parent, mine, segLen(t, j) * es));
    }
    for (int t = 0; t < 2; ++t) {  // D: the final segment j from the parent (the root has it) to the children
      long j = segAt(k, stepD(depth[t], 0));
      if (j < 0 || !segLen(t, j)) continue;
      char* mine = out + segOff(t, j) * es;
      if (tree[t].parent >= 0) ctx.wait(down_recv[t][j]);
      for (int c = 0; c < 2; ++c)
        if (tree[t].child[c] >= 0) sends.push_back(ctx.isend(tree[t].child[c], mine, segLen(t, j) * es));
    }
  }
  ctx.waitAll(sends);
}

namespace {
double treeCost(double n, int p, const TransportParams& t) {
  if (p == 1) return 0;
  const int d = ceilLog2(p);
  const double s = static_cast<double>(treeSegments(n / 2, d, kDefaultSegmentBytes));
  return (s + 2 * d) * t.alpha + (1 + 2 * d / s) * (2 * n * t.beta + n * t.gamma);
}

// The cross-host structure of both trees on H hosts of L consecutive ranks:
// {x: most crossing edges on a rank's path to its root, E: most crossing edge
// ends at one host}.
struct TreeCrossing {
  int x = 0, ends = 0;
};
TreeCrossing countCrossing(int p, int L) {
  TreeCrossing out;
  std::vector<int> ends(static_cast<size_t>((p + L - 1) / L), 0);
  for (int t = 0; t < 2; ++t) {
    std::vector<int> parent(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) {
      parent[r] = treeOf(t, r, p).parent;
      if (parent[r] >= 0 && parent[r] / L != r / L) {
        ++ends[r / L];
        ++ends[parent[r] / L];
      }
    }
    for (int r = 0; r < p; ++r) {
      int x = 0;
      for (int u = r; parent[u] >= 0; u = parent[u]) x += parent[u] / L != u / L;
      out.x = std::max(out.x, x);
    }
  }
  for (int e : ends) out.ends = std::max(out.ends, e);
  return out;
}

// countCrossing walks both trees (O(p log p)); the selector prices the tree at every new size of
// a call, so each thread keeps the shapes it has counted (a process sees a few).
TreeCrossing treeCrossing(int p, int L) {
  thread_local std::map<std::pair<int, int>, TreeCrossing> seen;
  auto [it, fresh] = seen.try_emplace({p, L});
  if (fresh) it->second = countCrossing(p, L);
  return it->second;
}

double treeHostsCost(double n, const HierShape& sh, const TransportParams& in, const TransportParams& ex) {
  const int p = sh.hosts * sh.local;
  if (p == 1) return 0;
  const int d = ceilLog2(p);
  const double s = static_cast<double>(treeSegments(n / 2, d, kDefaultSegmentBytes)), seg = n / (2 * s);
  const TreeCrossing c = treeCrossing(p, sh.local);
  const double fill = 2 * (c.x * (ex.alpha + seg * ex.beta) + (d - c.x) * (in.alpha + seg * in.beta)) +
                      2 * d * seg * ex.gamma;
  // A step waits for the neighbours' messages of the step before: across hosts at least one latency.
  const double link = std::max(sharedLinkSeconds(ex, seg, std::max(c.ends, 1)), 4 * seg * in.beta);
  const double step = std::max(link, c.x > 0 ? ex.alpha + seg * ex.beta : 0.0) + seg * ex.gamma;
  return fill + s * step;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "tree", .fn = allreduceTree, .cost = treeCost,
                         .flat_hier_cost = treeHostsCost});

}  // namespace harp
