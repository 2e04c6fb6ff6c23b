// Allreduce through shared memory (all ranks on one host, shm transport).
// Each rank owns two collective buffers of C bytes in its shm segment (the
// shm transport's collective area, HARP_SHM_COLL_BYTES). The vector goes in
// chunks of C bytes, alternating buffers so chunk k+1 is copied in while
// others still read chunk k. Per chunk (step s, buffer b = s % 2):
//   (buffer reuse needs no flag: a rank that arrived at step s-1 is done
//   with everything of step s-2, and every step waits for all arrivals)
//   1. inputs of <= 48 bytes: data + descriptor + step flag in one cache line
//      per rank (TinySlot); everyone reduces all N in rank order; done.
//   2. otherwise copy my input chunk into my buffer b (sliced mode: all but my own
//      slice, which nobody else reads), publish ready = s;
//   3a. small chunks (<= HARP_SHM_DIRECT_BYTES): wait for every rank's
//       ready, reduce all N buffers (order 0..N-1, so all ranks get bitwise
//       identical results) straight into recvbuf; done.
//   3b. otherwise: reduce my 1/N slice (my send buffer + every other rank's
//       buffer) into my own buffer's slice, publish reduced = s; then copy every
//       rank's reduced slice into recvbuf (reading their buffers directly).
// Flags are monotonic step counters, one cache line each, written only by
// their owner; waits spin briefly, yield, then sleep on the rank's futex
// doorbell (ShmTransport::waitFor), checking aborts, dead peers and stray
// messages (another collective => mismatch).
// Cost per rank (n bytes, chunks in cache): read n + write n of memory, plus
// (N-1)/N·n·gamma of reduction; 2 synchronizations per chunk (1 when small),
// one cache line per rank when tiny.
// Agreement: every rank compares every rank's descriptor (the full tag: seq,
// algorithm, kind, dtype, op, count mod 2^32; counts >= 2^32 and count 0 are
// checked exactly by the communicator before this runs). After it returns,
// the communicator's closing check reads each peer's abort line in this
// rank's own segment (N-1 loads; 2 ranks, 8 bytes: 0.57 -> 0.63 us with the
// call guard), so a peer that aborted after publishing its input fails the
// collective here too.
// Trust: the only peer-written words read are step flags and descriptors,
// compared and never used as a size or offset; every length copied or
// reduced comes from this rank's own call (count, dtype, chunk size), so a
// hostile local peer can spoil the result but not move an access outside the
// collective buffers (SECURITY.md, "Shared memory").
// Restrictions: every peer reached by one ShmTransport with a collective area;
// otherwise it runs the ring algorithm instead (and says so at INFO level).
// Hosted by the shm transport: it lives in transport/shm/ and reaches its
// transport only through Transport::capability (capabilityOf<ShmTransport>).
// harp-layer: algorithm
#include <cstdio>
#include <cstring>

#include "core/algorithms/registry.h"
#include "base/env.h"
#include "base/log.h"
#include "base/reduce.h"
#include "bootstrap/socket.h"
#include "transport/shm/shm_transport.h"

namespace harp {

namespace {
transport::shm::ShmTransport* shmFor(Context& ctx) {
  transport::shm::ShmTransport* t = nullptr;
  for (int p = 0; p < ctx.size(); ++p) {
    if (p == ctx.rank()) continue;
    auto* s = transport::capabilityOf<transport::shm::ShmTransport>(ctx.transportOf(p));
    if (!s || (t && s != t)) return nullptr;
    t = s;
  }
  return t && t->coversCommunicator() ? t : nullptr;
}
}  // namespace

void allreduceShm(Context& ctx) {
  const CollArgs& a = ctx.args();
  const size_t es = ctx.elemSize(), bytes = a.count * es;
  const int N = ctx.size(), me = ctx.rank();
  if (N == 1 || a.count == 0) {
    copyBytes(a.recvbuf, a.sendbuf, bytes);
    return;
  }
  transport::shm::ShmTransport* t = shmFor(ctx);
  if (!t) {
    HARP_INFO_S(LogSubsys::kShm, "allreduce shm: not every rank is on the shm transport of this host; using ring");
    return allreduceRing(ctx);
  }
  static const size_t kDirect = env::bytes("HARP_SHM_DIRECT_BYTES");
  // AVG reduces as SUM; the communicator divides once afterwards.
  const ReduceOp rop = a.op == ReduceOp::kAvg ? ReduceOp::kSum : a.op;
  const size_t ce = t->collChunkBytes() / es;  // elements per chunk
  const char* src = static_cast<const char*>(a.sendbuf);
  char* dst = static_cast<char*>(a.recvbuf);
  const uint64_t tag = ctx.tag();
  const double tmo = ctx.timeout();
  // Every rank's flags; on the stack for hosts of up to 16 ranks (no allocation per call).
  transport::shm::CollFlags* fl_stack[16];
  std::vector<transport::shm::CollFlags*> fl_heap(N > 16 ? N : 0);
  transport::shm::CollFlags** fl = N > 16 ? fl_heap.data() : fl_stack;
  for (int q = 0; q < N; ++q) fl[q] = t->collFlags(q);
  transport::shm::CollFlags* mine = fl[me];

  // Wait until flag(q) >= s for every q in `ranks` (all when empty).
  auto waitRanks = [&](std::atomic<uint64_t> transport::shm::CollFlags::*flag, uint64_t s, int only,
                       const char* phase) {
    auto behind = [&](int q) { return (fl[q]->*flag).load(std::memory_order_acquire) < s; };
    t->waitFor(
        [&] {
          if (only >= 0) return !behind(only);
          for (int q = 0; q < N; ++q)
            if (behind(q)) return false;
          return true;
        },
        tmo, "allreduce (shm)",
        [&] {
          std::string late;
          for (int q = 0; q < N; ++q)
            if ((only < 0 || q == only) && behind(q)) late += (late.empty() ? "" : ", ") + std::to_string(q);
          return describeTag(tag) + " on rank " + std::to_string(me) + " timed out after " + formatSeconds(tmo) +
                 " s waiting for rank(s) " + late + " (" + phase +
                 "; a rank is stuck, dead, or did not call this collective)";
        });
  };
  using F = transport::shm::CollFlags;

  // Quick inline poll before the general wait (which spins, yields, sleeps).
  const int polls = t->inlinePolls();
  auto arrived = [&](auto&& cond) {
    for (int i = 0; i < polls; ++i) {
      if (cond()) return true;
      transport::shm::cpuRelax();
    }
    return false;
  };
  auto checkDesc = [&](int q, uint64_t d) {
    if (d != tag)
      throw Error(Error::kMismatch, "rank " + std::to_string(q) + " called " + describeTag(d) + " while rank " +
                                        std::to_string(me) + " called " + describeTag(tag) +
                                        ": collective mismatch between rank " + std::to_string(me) + " and rank " +
                                        std::to_string(q));
  };

  // Buffer reuse needs no extra flag: a rank that arrived at step s-1 has
  // finished everything of step s-2, and every step waits for all arrivals.
  for (size_t off = 0; off < a.count; off += ce) {
    const size_t n = std::min(ce, a.count - off);
    const uint64_t s = t->nextCollStep();
    const int b = static_cast<int>(s & 1);
    const char* in = src + off * es;
    char* out = dst + off * es;

    if (n * es <= sizeof(transport::shm::TinySlot::data)) {
      // Tiny: data, descriptor and flag in one cache line per rank.
      transport::shm::TinySlot& ts = mine->tiny[b];
      std::memcpy(ts.data, in, n * es);
      ts.desc = tag;
      ts.step.store(s, std::memory_order_release);
      t->wakeAll();
      auto all = [&] {
        for (int q = 0; q < N; ++q)
          if (fl[q]->tiny[b].step.load(std::memory_order_acquire) < s) return false;
        return true;
      };
      if (!arrived(all))
        t->waitFor(all, tmo, "allreduce (shm)", [&] {
          std::string late;
          for (int q = 0; q < N; ++q)
            if (fl[q]->tiny[b].step.load() < s) late += (late.empty() ? "" : ", ") + std::to_string(q);
          return describeTag(tag) + " on rank " + std::to_string(me) + " timed out after " +
                 formatSeconds(tmo) + " s waiting for rank(s) " + late +
                 " (a rank is stuck, dead, or did not call this collective)";
        });
      for (int q = 0; q < N; ++q) checkDesc(q, fl[q]->tiny[b].desc);
      uint8_t tmp[sizeof(transport::shm::TinySlot::data)];
      reduce(tmp, fl[0]->tiny[b].data, fl[1]->tiny[b].data, n, a.dtype, rop);
      for (int q = 2; q < N; ++q) reduce(tmp, tmp, fl[q]->tiny[b].data, n, a.dtype, rop);
      std::memcpy(out, tmp, n * es);
      continue;
    }

    // Copy in, publish. (Sliced mode: my own slice is read by nobody else,
    // so it stays in my send buffer and is reduced from there.)
    const bool direct = n * es <= kDirect;
    Blocks bl{n, static_cast<size_t>(N)};
    const size_t so = bl.offset(me) * es, sn = bl.size(me);
    uint8_t* my = t->collBuf(me, b);
    if (direct) {
      std::memcpy(my, in, n * es);
    } else {
      std::memcpy(my, in, so);
      std::memcpy(my + so + sn * es, in + so + sn * es, n * es - so - sn * es);
    }
    mine->desc[b].store(tag, std::memory_order_relaxed);
    mine->ready.store(s, std::memory_order_release);
    t->wakeAll();
    auto allReady = [&] {
      for (int q = 0; q < N; ++q)
        if (fl[q]->ready.load(std::memory_order_acquire) < s) return false;
      return true;
    };
    if (!arrived(allReady)) waitRanks(&F::ready, s, -1, "input not yet in shared memory");
    for (int q = 0; q < N; ++q) checkDesc(q, fl[q]->desc[b].load(std::memory_order_relaxed));
    if (direct) {
      // Everyone reduces the whole chunk, same operand order everywhere.
      reduce(out, t->collBuf(0, b), t->collBuf(1, b), n, a.dtype, rop);
      for (int q = 2; q < N; ++q) reduce(out, out, t->collBuf(q, b), n, a.dtype, rop);
      continue;
    }
    // Sliced: reduce my slice into my buffer, then gather all slices.
    if (sn) {
      reduce(my + so, in + so, t->collBuf((me + 1) % N, b) + so, sn, a.dtype, rop);
      for (int k = 2; k < N; ++k) reduce(my + so, my + so, t->collBuf((me + k) % N, b) + so, sn, a.dtype, rop);
    }
    mine->reduced.store(s, std::memory_order_release);
    t->wakeAll();
    for (int k = 0; k < N; ++k) {
      int q = (me + k) % N;
      if (!arrived([&] { return fl[q]->reduced.load(std::memory_order_acquire) >= s; }))
        waitRanks(&F::reduced, s, q, "reduced slice not ready");
      std::memcpy(dst + (off + bl.offset(q)) * es, t->collBuf(q, b) + bl.offset(q) * es, bl.size(q) * es);
    }
  }
}

namespace {
// One copy in, one copy out, (p-1)/p of the reduction, two synchronizations.
double shmCost(double n, int p, const TransportParams& t) {
  return 2 * t.alpha + 2 * n * t.beta + (p - 1.0) / p * n * t.gamma;
}
}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "shm", .fn = allreduceShm,
                         .restrictions = {.transport = "shm"}, .cost = shmCost, .fallback = "ring"});

}  // namespace harp
