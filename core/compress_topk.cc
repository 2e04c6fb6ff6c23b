// Allreduce, sparse top-k (optionally with error feedback) for float32 sum/avg
// (core/compress.h: when it runs, keys, residual bounds).
//
// Steps, p ranks, n elements, k = CompressEngine::topkCount (ratio or count):
//   1. acc = input (+ the key's residual with ef; acc is then kept as the
//      residual itself).
//   2. selection: the k entries of largest |acc| (NaN and inf count as
//      largest), ties broken by the lower index — a total order, so the choice
//      is the same run to run: the k-th largest magnitude t by nth_element
//      (over the candidates at or above a threshold estimated from a fixed
//      strided sample of 64K entries, about 1.5k of them, when n is large and
//      k small), then, in index order, every entry above t and the first ones
//      equal to t until k are taken. They become k (uint32 index, float value) pairs in
//      increasing index order; with ef their residual entries are zeroed.
//   3. ring allgather of the pair blocks (p-1 steps, k·8 bytes each);
//      received indices are checked against n.
//   4. output = 0, then every rank's pairs are added in rank order 0..p-1:
//      the same additions in the same order on every rank, so results are
//      bit-identical everywhere.
// Bytes sent per rank: (p-1)·8k (CompressEngine::bytes_sent). Requires n < 2^32.
// Cost (n in float32 bytes, K = 8k): (p-1)·alpha + (p-1)·K·beta
//       + (6n + 4pK)·gamma: the copy or residual update, the candidate scan
//       (a compare per element, weighted 3 passes), zeroing the output, and
//       the candidates' selection plus the scatter-add of p·k pairs.
// Not yet: the balanced sparse reduce-scatter + allgather (Ok-Topk) for large
// k·p; the allgather form is always used.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/compress.h"

namespace harp {
namespace {

struct Pair {
  uint32_t index;
  float value;
};
static_assert(sizeof(Pair) == 8);

inline float magnitude(float v) {
  const float m = std::fabs(v);
  return m <= 3.4028235e38f ? m : INFINITY;  // NaN and inf sort first
}

// Takes, in index order, the entries of `cand` (indices into acc, increasing) above t and the
// first ones equal to t until k pairs are out; t is the k-th largest magnitude of the candidates.
void takeTopk(const float* acc, const uint32_t* cand, size_t c, size_t k, float* mags, Pair* out) {
  for (size_t i = 0; i < c; ++i) mags[i] = magnitude(acc[cand ? cand[i] : i]);
  std::nth_element(mags, mags + (k - 1), mags + c, std::greater<float>());
  const float t = mags[k - 1];
  size_t above = 0;
  for (size_t i = 0; i < c; ++i) above += magnitude(acc[cand ? cand[i] : i]) > t;
  size_t ties = k - above, m = 0;
  for (size_t i = 0; i < c && m < k; ++i) {
    const uint32_t x = cand ? cand[i] : static_cast<uint32_t>(i);
    const float g = magnitude(acc[x]);
    if (g > t || (g == t && ties > 0)) {
      if (g == t) --ties;
      out[m++] = {x, acc[x]};
    }
  }
}

// The k entries of acc with the largest magnitude (ties: lower index) as pairs, in index order.
// Large n, small k: a threshold from a fixed strided sample keeps only the entries at or above
// it as candidates (about 1.5k), so the exact selection runs over those instead of all n; when
// the sample misjudges (fewer than k candidates) the whole vector is used. Both paths give the
// same answer: every entry below the threshold is below the k-th largest.
void selectTopk(const float* acc, size_t n, size_t k, float* mags, Pair* out) {
  constexpr size_t kSample = 1 << 16;
  if (n >= 4 * kSample && k <= n / 16) {
    const size_t stride = n / kSample;
    for (size_t i = 0; i < kSample; ++i) mags[i] = magnitude(acc[i * stride]);
    const size_t want = std::min(kSample - 1, (k * kSample) / n * 3 / 2 + 16);
    std::nth_element(mags, mags + want, mags + kSample, std::greater<float>());
    const float est = mags[want];
    static thread_local std::vector<uint32_t> cand;
    cand.clear();
    for (size_t i = 0; i < n; ++i)
      if (magnitude(acc[i]) >= est) cand.push_back(static_cast<uint32_t>(i));
    if (cand.size() >= k) return takeTopk(acc, cand.data(), cand.size(), k, mags, out);
  }
  takeTopk(acc, nullptr, n, k, mags, out);
}

}  // namespace

void allreduceTopk(Context& ctx) {
  const CollArgs& a = ctx.args();
  CompressEngine& eng = *a.compress.engine;
  const int p = ctx.size(), r = ctx.rank();
  const size_t n = a.count, k = CompressEngine::topkCount(a.compress, n);
  const size_t blk = k * sizeof(Pair);
  // Scratch: [mags: n floats][acc: n floats unless ef][pairs: p blocks]
  const bool ef = a.compress.ef;
  char* base = static_cast<char*>(ctx.scratch(n * 4 * (ef ? 1 : 2) + p * blk));
  float* mags = reinterpret_cast<float*>(base);
  float* acc = ef ? nullptr : mags + n;
  Pair* pairs = reinterpret_cast<Pair*>(base + n * 4 * (ef ? 1 : 2));
  const float* in = static_cast<const float*>(a.sendbuf);
  if (ef) {
    const std::string key = a.compress.key.empty()
                                ? std::to_string(reinterpret_cast<uintptr_t>(a.recvbuf)) + ":" + std::to_string(n)
                                : a.compress.key;
    acc = eng.residual(key, n);
    for (size_t i = 0; i < n; ++i) acc[i] += in[i];
  } else {
    std::memcpy(acc, in, n * 4);
  }
  Pair* mine = pairs + r * k;
  selectTopk(acc, n, k, mags, mine);
  if (ef)
    for (size_t j = 0; j < k; ++j) acc[mine[j].index] = 0.0f;

  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  std::vector<Request*> sends;
  for (int s = 0; s < p - 1; ++s) {
    const int sb = mod(r - s), rb = mod(r - s - 1);
    sends.push_back(ctx.isend(right, pairs + sb * k, blk));
    ctx.wait(ctx.irecv(left, pairs + rb * k, blk));
  }
  ctx.waitAll(sends);
  eng.bytes_sent.fetch_add(static_cast<uint64_t>(p - 1) * blk, std::memory_order_relaxed);

  float* out = static_cast<float*>(a.recvbuf);
  std::memset(out, 0, n * 4);
  for (int q = 0; q < p; ++q) {
    const Pair* b = pairs + q * k;
    for (size_t j = 0; j < k; ++j) {
      if (b[j].index >= n)
        throw Error(Error::kPeerFailure, "allreduce (top-k): rank " + std::to_string(q) + " sent index " +
                                             std::to_string(b[j].index) + " for " + std::to_string(n) + " elements");
      out[b[j].index] += b[j].value;
    }
  }
}

double topkCost(double n, double kbytes, int p, const TransportParams& t) {
  return (p - 1) * t.alpha + (p - 1) * kbytes * t.beta + (6 * n + 4 * p * kbytes) * t.gamma;
}

}  // namespace harp
