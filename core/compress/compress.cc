// Wire compression: spec parsing, the gate, residual bookkeeping and the
// communicator's dispatch (core/compress/compress.h has the manual).
#include "core/compress/compress.h"

#include <cmath>
#include <cstdlib>

#include "base/env.h"
#include "base/log.h"

namespace harp {

void allreduceRingNarrow(Context&);  // core/algorithms/compressed/compress_ring.cc
void allreduceTopk(Context&);        // core/algorithms/compressed/compress_topk.cc
void allreduceTopkRs(Context&);
double topkRsCost(double n, double kbytes, int p, const TransportParams& t);
double ringNarrowCost(double n, int p, const TransportParams& t);
double topkCost(double n, double kbytes, int p, const TransportParams& t);

namespace {

// Reserved indices (tag and descriptor): above every registered allreduce algorithm.
Algorithm makeAlgorithm(const char* name, AlgorithmFn fn, unsigned index) {
  Algorithm a;
  a.coll = CollType::kAllreduce;
  a.name = name;
  a.fn = fn;
  a.index = index;
  return a;
}
const Algorithm kFp16 = makeAlgorithm("ring_fp16", allreduceRingNarrow, 15);
const Algorithm kBf16 = makeAlgorithm("ring_bf16", allreduceRingNarrow, 14);
const Algorithm kTopk = makeAlgorithm("topk_allgather", allreduceTopk, 13);
const Algorithm kTopkRs = makeAlgorithm("topk_reduce_scatter", allreduceTopkRs, 12);
constexpr size_t kFirstReserved = 12;

const char* kindName(CompressKind k) {
  switch (k) {
    case CompressKind::kDefault: return "default";
    case CompressKind::kNone: return "none";
    case CompressKind::kFp16: return "fp16";
    case CompressKind::kBf16: return "bf16";
    case CompressKind::kTopk: return "topk";
  }
  return "?";
}

void topkArgument(CompressSpec& s, const std::string& v, const std::string& bad) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !std::isfinite(x) || x <= 0) throw InvalidArgument(bad);
  if (x < 1) s.ratio = x;
  else if (x == std::floor(x) && x < 1.8e19) s.k = static_cast<uint64_t>(x);
  else throw InvalidArgument(bad);
}

}  // namespace

CompressSpec parseCompressSpec(const std::string& text, const char* what) {
  const std::string bad = std::string(what) + ": '" + text +
                          "' is not a compression spec (none, fp16, bf16, topk:RATIO or topk:K, then ',ef' for top-k "
                          "error feedback and a trailing '!' to force)";
  CompressSpec s;
  std::string t = text;
  if (!t.empty() && t.back() == '!') {
    s.force = true;
    t.pop_back();
  }
  std::string head = t, opts;
  if (auto comma = t.find(','); comma != std::string::npos) {
    head = t.substr(0, comma);
    opts = t.substr(comma + 1);
  }
  if (head.empty() || head == "none" || head == "off" || head == "0") s.kind = CompressKind::kNone;
  else if (head == "fp16") s.kind = CompressKind::kFp16;
  else if (head == "bf16") s.kind = CompressKind::kBf16;
  else if (head.rfind("topk:", 0) == 0) {
    s.kind = CompressKind::kTopk;
    topkArgument(s, head.substr(5), bad);
  } else {
    throw InvalidArgument(bad);
  }
  if (!opts.empty()) {
    if (opts != "ef" || s.kind != CompressKind::kTopk) throw InvalidArgument(bad);
    s.ef = true;
  }
  return s;
}

std::string compressSpecText(const CompressSpec& s) {
  std::string t = kindName(s.kind);
  if (s.kind == CompressKind::kTopk) {
    char b[40];
    if (s.k) snprintf(b, sizeof b, ":%llu", static_cast<unsigned long long>(s.k));
    else snprintf(b, sizeof b, ":%g", s.ratio);
    t += b;
    if (s.ef) t += ",ef";
  }
  return s.force ? t + "!" : t;
}

CompressEngine::CompressEngine(int rank, bool all_local) : rank_(rank), all_local_(all_local) {
  default_ = parseCompressSpec(env::str("HARP_COMPRESS"), "HARP_COMPRESS");
  min_bytes_ = env::bytes("HARP_COMPRESS_MIN_BYTES");
  const std::string intra = env::str("HARP_COMPRESS_INTRA");
  if (intra != "none" && intra != "same")
    throw InvalidArgument("HARP_COMPRESS_INTRA: '" + intra + "' is not none or same");
  intra_ = intra == "same";
  force_ = env::flag("HARP_COMPRESS_FORCE");
  max_residual_bytes_ = env::bytes("HARP_COMPRESS_RESIDUAL_BYTES");
  collides_ = algorithmsOf(CollType::kAllreduce).size() > kFirstReserved;
}

void CompressEngine::checkIndices() const {
  if (collides_)
    throw Error(Error::kInternal, "more than " + std::to_string(kFirstReserved) +
                                      " allreduce algorithms are registered: they collide with compression's reserved "
                                      "indices (core/compress/compress.h)");
}

uint64_t CompressEngine::topkCount(const CompressSpec& s, size_t count) {
  uint64_t k = s.k ? s.k : static_cast<uint64_t>(std::llround(s.ratio * static_cast<double>(count)));
  return std::min<uint64_t>(std::max<uint64_t>(k, 1), count);
}

const Algorithm* CompressEngine::algorithm(CompressKind kind) {
  switch (kind) {
    case CompressKind::kFp16: return &kFp16;
    case CompressKind::kBf16: return &kBf16;
    case CompressKind::kTopk: return &kTopk;
    default: return nullptr;
  }
}

CompressEngine::Decision CompressEngine::decide(const CompressSpec& s, size_t count, DataType dt, ReduceOp op, int p,
                                                const TransportParams& t) const {
  Decision d;
  const double n = static_cast<double>(count) * 4;
  auto no = [&](const char* why) {
    d.why = why;
    return d;
  };
  if (s.kind == CompressKind::kNone || s.kind == CompressKind::kDefault) return no("no compression asked");
  if (dt != DataType::kFloat32) return no("not float32");
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) return no("op is not sum or avg");
  if (p < 2 || count == 0) return no("nothing to send");
  if (s.kind == CompressKind::kTopk && count > 0xffffffffull) return no("top-k needs fewer than 2^32 elements");
  d.dense_s = findAlgorithm(CollType::kAllreduce, "ring")->cost(n, p, t);
  d.algo = algorithm(s.kind);
  if (s.kind == CompressKind::kTopk) {
    const double kb = 8.0 * topkCount(s, count), ag = topkCost(n, kb, p, t), rs = topkRsCost(n, kb, p, t);
    d.compressed_s = std::min(ag, rs);
    if (rs < ag) d.algo = &kTopkRs;
  } else {
    d.compressed_s = ringNarrowCost(n, p, t);
  }
  if (s.force || force_) {
    d.compress = true;
    d.why = "forced";
    return d;
  }
  if (static_cast<size_t>(n) < min_bytes_) return no("below HARP_COMPRESS_MIN_BYTES");
  if (all_local_ && !intra_) return no("every peer on this host (HARP_COMPRESS_INTRA=none)");
  d.compress = d.compressed_s < d.dense_s;
  d.why = d.compress ? "predicted faster" : "predicted slower";
  return d;
}

void CompressEngine::logDecision(const CompressSpec& s, size_t bytes, int p, const Decision& d) {
  if (logLevel() < LogLevel::kInfo) return;
  const std::string key = compressSpecText(s) + "/" + std::to_string(bytes);
  std::lock_guard<std::mutex> g(mu_);
  if (std::find(logged_.begin(), logged_.end(), key) != logged_.end() || logged_.size() > 256) return;
  logged_.push_back(key);
  HARP_INFO("allreduce %zu bytes, %d ranks, compress=%s: %s (%s; predicted dense %.3g s, %s %.3g s)", bytes, p,
            compressSpecText(s).c_str(), d.compress ? "compressed" : "dense", d.why.c_str(), d.dense_s,
            d.algo ? d.algo->name : "compressed", d.compressed_s);
}

std::shared_ptr<std::vector<float>> CompressEngine::residual(const std::string& key, size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = residuals_.find(key);
  if (it != residuals_.end() && it->second->size() != n) {
    HARP_WARN("top-k residual '%s' had %zu elements, this call has %zu: starting it over", key.c_str(),
              it->second->size(), n);
    residuals_.erase(it);
    lru_.remove(key);
    it = residuals_.end();
  }
  if (it == residuals_.end()) {
    size_t used = 0;
    for (auto& kv : residuals_) used += kv.second->size() * 4;
    while (used + n * 4 > max_residual_bytes_ && !lru_.empty()) {
      const std::string old = lru_.back();
      lru_.pop_back();
      HARP_WARN("top-k residuals over HARP_COMPRESS_RESIDUAL_BYTES (%zu): dropping '%s'", max_residual_bytes_,
                old.c_str());
      used -= residuals_[old]->size() * 4;
      residuals_.erase(old);
    }
    it = residuals_.emplace(key, std::make_shared<std::vector<float>>(n, 0.0f)).first;
  } else {
    lru_.remove(key);
  }
  lru_.push_front(key);
  return it->second;
}

std::vector<float> CompressEngine::residualCopy(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = residuals_.find(key);
  return it == residuals_.end() ? std::vector<float>{} : *it->second;
}

void CompressEngine::clearResiduals(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  if (key.empty()) {
    residuals_.clear();
    lru_.clear();
    return;
  }
  residuals_.erase(key);
  lru_.remove(key);
}

size_t CompressEngine::residualBytes() {
  std::lock_guard<std::mutex> g(mu_);
  size_t used = 0;
  for (auto& kv : residuals_) used += kv.second->size() * 4;
  return used;
}

}  // namespace harp
