// core/engine/communicator_compress.cc — the communicator's side of wire
// compression: its CompressEngine (core/compress/compress.h), made at the
// first call that may compress, and the choice of a compressed algorithm for
// one call (the pipeline's choose stage asks before selection, core/engine/pipeline.h).
#include <memory>
#include <mutex>
#include <string>

#include "core/compress/compress.h"
#include "core/engine/communicator.h"

namespace harp {


CompressEngine& Communicator::compression() {
  std::call_once(compress_once_, [this] {
    bool all_local = true;
    for (const auto& peer : peers_) all_local = all_local && peer.host_id == peers_[rank_].host_id;
    compress_ = std::make_shared<CompressEngine>(rank_, all_local);
  });
  return *compress_;
}

const Algorithm* Communicator::compressedAlgorithm(CollArgs& a) {
  CompressEngine& eng = compression();
  if (a.compress.kind == CompressKind::kDefault) {
    if (eng.defaultSpec().kind == CompressKind::kNone) return nullptr;  // the per-call path: no copy
    const std::string key = std::move(a.compress.key);
    a.compress = eng.defaultSpec();
    a.compress.key = key;
    if (a.compress.kind == CompressKind::kNone) return nullptr;
  }
  const CompressEngine::Decision d =
      eng.decide(a.compress, a.count, a.dtype, a.op, size_, calibration_.params(transport_kind_));
  eng.logDecision(a.compress, a.count * dtypeSize(a.dtype), size_, d);
  if (!d.compress) {
    eng.dense_calls.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  eng.checkIndices();  // only a compressed call needs the reserved indices
  eng.compressed_calls.fetch_add(1, std::memory_order_relaxed);
  a.compress.engine = &eng;
  return d.algo;
}

}  // namespace harp
