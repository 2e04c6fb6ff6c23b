// core/compress/compress.h — wire compression for float32 sum/avg allreduce.
//
// Usage. A CollArgs carries a CompressSpec (core/engine/communicator.h). Python:
//   comm.allreduce(x, compress="fp16")            # fp16 on the wire, float32 sums
//   comm.allreduce(x, compress="bf16!")           # '!': forced, the gate is skipped
//   comm.allreduce(g, compress="topk:0.01,ef", key="layer3")  # top-k, error feedback
// and for unmodified programs (Python API, torch backend, NCCL API alike) the
// environment: HARP_COMPRESS=fp16|bf16|topk:RATIO[,ef] (topk:K with an integer
// K >= 1 sends K elements), HARP_COMPRESS_MIN_BYTES, HARP_COMPRESS_INTRA,
// HARP_COMPRESS_FORCE, HARP_COMPRESS_RESIDUAL_BYTES (base/params.def).
// An explicit spec ("none" included) overrides HARP_COMPRESS for that call.
//
// Kinds (each its own algorithm file, with steps and cost):
//   fp16, bf16  core/algorithms/compressed/compress_ring.cc: ring reduce-scatter + allgather whose
//               messages are the narrow type (half the bytes); every partial
//               sum is accumulated in float32, rounded (nearest-even) only to
//               travel. The owner of a block rounds its final sum once and uses
//               the rounded value itself, so every rank ends bit-identical.
//               Error bound per element, p ranks, unit roundoff u (2^-11 fp16,
//               2^-8 bf16), S = sum_i |x_i|:
//                 |result - exact| <= p*(u*S + h) + (p-1)*2^-24*S
//               (h = 2^-25 for fp16 subnormals, 0 for bf16; fp16 saturates to
//               inf above 65504: use bf16 for large values).
//   topk        core/algorithms/compressed/compress_topk.cc: each rank sends its k largest |x| (ties
//               by lower index) as (uint32 index, float value) pairs; a ring
//               allgather of the pairs, summed in rank order into a zeroed
//               output on every rank (identical everywhere); or, where the
//               cost model prefers it (k(p-1) > ~n/2), a balanced sparse
//               reduce-scatter to region owners + dense allgather with the
//               same sums in the same order. With ef the
//               residual (input + previous residual - what was sent) is kept
//               per key and added before the next selection, so over steps
//               sum(sent) + residual == sum(inputs).
//
// Gate (CompressEngine::decide): compression runs only when (1) the op is a
// float32 sum/avg allreduce on >= 2 ranks with count >= 1, (2) bytes >=
// HARP_COMPRESS_MIN_BYTES, (3) some peer is on another host, or
// HARP_COMPRESS_INTRA=same (default none: a communicator whose ranks share one
// host — loopback tcp, shm — never compresses), and (4) the predicted time
// (alpha-beta-gamma of the communicator's transport from its Calibration,
// core/select/cost.h, conversion and selection costs counted in gamma) beats dense
// ring's. A forced spec ('!' or HARP_COMPRESS_FORCE=1) skips (2)-(4).
// HARP_DEBUG=INFO logs each decision once per (size, kind) with both times.
// Hierarchy: a hierarchical allreduce hands the CollArgs (spec included) to
// its sub-communicators; the intra-host ones have all peers local and stay
// dense under HARP_COMPRESS_INTRA=none, the inter-host leg compresses when its
// gate says so — BytePS's "compress the inter-host leg only".
//
// Mismatch: a compressed allreduce runs under a reserved algorithm index
// (fp16 15, bf16 14, topk 13, topk reduce-scatter form 12) in the tag and the descriptor, so ranks that
// disagree (one dense, one compressed, fp16 vs bf16) get MismatchError; top-k
// ranks that disagree about k post different lengths: MismatchError too.
// More than 12 registered allreduce algorithms would collide: a compressed
// call then raises InternalError naming this file (dense calls are unaffected).
//
// Residuals: bounded by HARP_COMPRESS_RESIDUAL_BYTES in all; the least
// recently used key is dropped (WARN) when a new one does not fit; a key whose
// element count changes starts over (WARN). clearResiduals() frees them.
//
// Lifetime and threading: one CompressEngine per communicator, created on
// first use; decide() is const; residuals and counters are touched by the
// thread executing a collective (under the communicator's execution lock);
// the read-only accessors take the engine's own mutex, counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/algorithms/algorithm.h"
#include "core/engine/call.h"

namespace harp {

// "none", "fp16", "bf16", "topk:0.01", "topk:1000,ef", each optionally with a
// trailing '!' (force). Throws InvalidArgument naming `what` and the text.
CompressSpec parseCompressSpec(const std::string& text, const char* what);
std::string compressSpecText(const CompressSpec& s);

// Kernels (core/compress/compress_kernels.cc): round-to-nearest-even float32 ->
// fp16/bf16 and back; AVX-512F or AVX2+F16C where the CPU has them, scalar
// otherwise. isa: "auto", "scalar" (tests compare the two).
using NarrowFn = void (*)(uint16_t* dst, const float* src, size_t n);
using WidenFn = void (*)(float* dst, const uint16_t* src, size_t n);
using AddWideFn = void (*)(float* dst, const float* a, const uint16_t* b, size_t n);  // dst = a + widen(b)
struct NarrowKernels {
  NarrowFn narrow;
  WidenFn widen;
  AddWideFn add;
  const char* isa;
};
const NarrowKernels& narrowKernels(CompressKind kind, const std::string& isa = "auto");

class CompressEngine {
 public:
  // Reads HARP_COMPRESS* now; `all_local`: every peer shares this rank's host.
  CompressEngine(int rank, bool all_local);

  const CompressSpec& defaultSpec() const { return default_; }
  struct Decision {
    bool compress = false;
    double dense_s = 0, compressed_s = 0;
    std::string why;
    const Algorithm* algo = nullptr;  // the compressed algorithm (top-k: allgather or reduce-scatter form)
  };
  // The gate (see the top of this file). `t`: the communicator's transport parameters.
  Decision decide(const CompressSpec& s, size_t count, DataType dt, ReduceOp op, int p,
                  const TransportParams& t) const;
  // Elements a top-k call sends per rank for `count` elements.
  static uint64_t topkCount(const CompressSpec& s, size_t count);
  // The algorithm of a kind (reserved indices, not in the registry).
  static const Algorithm* algorithm(CompressKind kind);
  // Throws InternalError when more than 12 allreduce algorithms are registered.
  void checkIndices() const;
  // Logs `d` at INFO once per (bytes, spec).
  void logDecision(const CompressSpec& s, size_t bytes, int p, const Decision& d);

  // Residual of `key` with n elements (zeros when new or resized). Shared: a
  // clearResiduals() from another thread while a collective uses it only drops
  // the engine's reference.
  std::shared_ptr<std::vector<float>> residual(const std::string& key, size_t n);
  std::vector<float> residualCopy(const std::string& key);
  void clearResiduals(const std::string& key = "");  // "": all
  size_t residualBytes();

  // Counters: bytes the compressed algorithms posted (sends, this rank), calls.
  std::atomic<uint64_t> bytes_sent{0}, compressed_calls{0}, dense_calls{0};

 private:
  int rank_;
  bool all_local_;
  CompressSpec default_;
  size_t min_bytes_;
  bool intra_ = false;  // HARP_COMPRESS_INTRA=same
  bool force_ = false;  // HARP_COMPRESS_FORCE
  bool collides_ = false;  // more registered allreduce algorithms than indices below the reserved ones
  size_t max_residual_bytes_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<std::vector<float>>> residuals_;
  std::list<std::string> lru_;  // most recent first
  std::vector<std::string> logged_;
};

}  // namespace harp
