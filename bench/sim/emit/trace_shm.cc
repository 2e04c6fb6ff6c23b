// bench/sim/emit/trace_shm.cc — the shm transport's own allreduce
// (transport/shm/allreduce_shm.cc, the built-in table's `allreduce shm * * shm`
// row) as the messages harp_sched records, so that a hierarchical algorithm's
// intra leg that the selector gives to it (rail's tail, leader's intra legs at
// small sizes) can be replayed. The real algorithm moves no messages: ranks
// read each other's buffers in a shared segment and synchronise on flags. Each
// read of a peer's buffer is recorded as a message of those bytes from that
// peer; each flag wait as the wait for them. Per chunk of HARP_SHM_COLL_BYTES
// (its default, 256 KiB):
//   tiny (<= 48 B): every rank reads every rank's cache line (64 B from each
//     peer), reduces all of them;
//   direct (<= HARP_SHM_DIRECT_BYTES, 16 KiB): every rank reads every rank's
//     chunk, reduces all of them;
//   sliced: rank r reads slice r of every peer's chunk and reduces it, then
//     reads every peer's reduced slice (a direct reduce-scatter, then a direct
//     allgather).
// Cost: the library's (shmCost in allreduce_shm.cc), restated here because
// that file belongs to the shm transport, which harp_sched does not link.
// Threading: single-threaded, as harp_sched.
#include <algorithm>
#include <vector>

#include "base/reduce.h"
#include "core/algorithms/registry.h"
#include "core/engine/context.h"

namespace harp {
namespace {
constexpr size_t kChunk = 256 << 10, kDirect = 16 << 10, kTiny = 48, kLine = 64;

// All peers at once: this rank receives recv(q) bytes from each peer q into scratch and sends
// each peer q send(q) bytes from `mine` (what q reads of this rank's buffer).
template <class Recv, class Send>
void readEveryPeer(Context& ctx, const char* mine, Recv recv, Send send, char* into) {
  const int p = ctx.size(), r = ctx.rank();
  std::vector<Request*> reqs;
  size_t at = 0;
  for (int s = 1; s < p; ++s) {
    const int from = (r - s + p) % p;
    reqs.push_back(ctx.irecv(from, into + at, recv(from)));
    at += recv(from);
  }
  for (int s = 1; s < p; ++s) reqs.push_back(ctx.isend((r + s) % p, mine, send((r + s) % p)));
  ctx.waitAll(reqs);
}

void allreduceShmTrace(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const size_t es = ctx.elemSize(), count = a.count;
  char* out = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(a.sendbuf);
  copyBytes(out, in, count * es);
  if (p == 1 || count == 0) return;
  const ReduceOp op = a.op;
  const size_t chunk = std::max<size_t>(1, kChunk / es);
  char* peers = static_cast<char*>(ctx.scratch((p - 1) * std::min(count, chunk) * es + (p - 1) * kLine));
  for (size_t off = 0; off < count; off += chunk) {
    const size_t c = std::min(chunk, count - off), bytes = c * es;
    char* mine = out + off * es;
    if (bytes <= kDirect) {
      const size_t m = bytes <= kTiny ? kLine : bytes;
      const auto all = [m](int) { return m; };
      readEveryPeer(ctx, mine, all, all, peers);
      for (int s = 1; s < p; ++s) reduce(mine, mine, peers + (s - 1) * bytes, c, a.dtype, op);
      continue;
    }
    const Blocks bl{c, static_cast<size_t>(p)};
    const size_t so = bl.offset(r) * es, sn = bl.size(r);
    const auto mySlice = [&](int) { return sn * es; };
    const auto theirs = [&](int q) { return bl.size(static_cast<size_t>(q)) * es; };
    readEveryPeer(ctx, mine, mySlice, theirs, peers);  // slice r of every peer's chunk
    for (int s = 1; s < p; ++s) reduce(mine + so, mine + so, peers + (s - 1) * sn * es, sn, a.dtype, op);
    readEveryPeer(ctx, mine + so, theirs, mySlice, peers);  // every peer's reduced slice
  }
}

double shmCost(double n, int p, const TransportParams& t) {
  return 2 * t.alpha + 2 * n * t.beta + (p - 1.0) / p * n * t.gamma;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "shm", .fn = allreduceShmTrace,
                         .restrictions = {.transport = "shm"}, .cost = shmCost, .fallback = "ring"});

}  // namespace harp
