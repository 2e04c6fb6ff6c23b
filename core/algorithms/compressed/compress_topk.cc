// Allreduce, sparse top-k (optionally with error feedback) for float32 sum/avg
// (core/compress/compress.h: when it runs, keys, residual bounds).
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
// For large k·p the gate picks allreduceTopkRs (below), a balanced sparse
// reduce-scatter + dense allgather with bit-identical results.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/compress/compress.h"

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

namespace {

// Steps 1-2 (both variants): every rank's k pairs, this rank's at pairs + r*k; room for p blocks.
struct Local {
  size_t n, k;
  Pair* pairs;
  Pair* mine;
  std::shared_ptr<std::vector<float>> residual;  // held until the collective ends (ef)
};

Local selectLocal(Context& ctx) {
  const CollArgs& a = ctx.args();
  CompressEngine& eng = *a.compress.engine;
  const int p = ctx.size(), r = ctx.rank();
  const size_t n = a.count, k = CompressEngine::topkCount(a.compress, n);
  // Scratch: [mags: n floats][acc: n floats unless ef][pairs: p blocks of k]
  const bool ef = a.compress.ef;
  char* base = static_cast<char*>(ctx.scratch(n * 4 * (ef ? 1 : 2) + p * k * sizeof(Pair)));
  float* mags = reinterpret_cast<float*>(base);
  float* acc = ef ? nullptr : mags + n;
  Pair* pairs = reinterpret_cast<Pair*>(base + n * 4 * (ef ? 1 : 2));
  const float* in = static_cast<const float*>(a.sendbuf);
  std::shared_ptr<std::vector<float>> res;
  if (ef) {
    const std::string key = a.compress.key.empty()
                                ? std::to_string(reinterpret_cast<uintptr_t>(a.recvbuf)) + ":" + std::to_string(n)
                                : a.compress.key;
    res = eng.residual(key, n);
    acc = res->data();
    for (size_t i = 0; i < n; ++i) acc[i] += in[i];
  } else {
    std::memcpy(acc, in, n * 4);
  }
  Pair* mine = pairs + r * k;
  selectTopk(acc, n, k, mags, mine);
  if (ef)
    for (size_t j = 0; j < k; ++j) acc[mine[j].index] = 0.0f;
  return {n, k, pairs, mine, std::move(res)};
}

// out[lo, hi) += the pairs, checking every index (a peer's bad index is an error, not a write).
void addPairs(float* out, const Pair* b, size_t m, size_t lo, size_t hi, int from) {
  for (size_t j = 0; j < m; ++j) {
    if (b[j].index < lo || b[j].index >= hi)
      throw Error(Error::kPeerFailure, "allreduce (top-k): rank " + std::to_string(from) + " sent index " +
                                           std::to_string(b[j].index) + " outside [" + std::to_string(lo) + ", " +
                                           std::to_string(hi) + ")");
    out[b[j].index] += b[j].value;
  }
}

}  // namespace

void allreduceTopk(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const Local l = selectLocal(ctx);
  const size_t blk = l.k * sizeof(Pair);
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  std::vector<Request*> sends;
  for (int s = 0; s < p - 1; ++s) {
    const int sb = mod(r - s), rb = mod(r - s - 1);
    sends.push_back(ctx.isend(right, l.pairs + sb * l.k, blk));
    ctx.wait(ctx.irecv(left, l.pairs + rb * l.k, blk));
  }
  ctx.waitAll(sends);
  a.compress.engine->bytes_sent.fetch_add(static_cast<uint64_t>(p - 1) * blk, std::memory_order_relaxed);
  float* out = static_cast<float*>(a.recvbuf);
  std::memset(out, 0, l.n * 4);
  for (int q = 0; q < p; ++q) addPairs(out, l.pairs + q * l.k, l.k, 0, l.n, q);
}

// The balanced variant (Ok-Topk's shape, without its second sparsification): the index range
// is cut into p regions (Blocks); each rank sends the pairs falling into region q to rank q
// (counts first, 8 bytes per peer; a count above k is an error), the owner adds every rank's
// pairs for its region in rank order 0..p-1 into its zeroed region of the output, and a ring
// allgather circulates the dense float32 regions. Each element is the same sum in the same
// order as in allreduceTopk: results are bit-identical to it and on every rank.
// Bytes per rank: 8(p-1) + 8·(pairs outside its region, ~k(p-1)/p) + 4·n(p-1)/p.
// Cost: 3(p-1)·alpha + (8k(p-1)/p + 4n(p-1)/p)·beta + the selection's gamma terms;
// cheaper than the allgather form when k(p-1) > ~n/2 (large ratios or many ranks).
void allreduceTopkRs(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size(), r = ctx.rank();
  const Local l = selectLocal(ctx);
  const Blocks reg{l.n, static_cast<size_t>(p)};
  std::vector<size_t> start(p + 1);
  for (int q = 0; q < p; ++q)
    start[q] = std::lower_bound(l.mine, l.mine + l.k, reg.offset(q),
                                [](const Pair& x, size_t v) { return x.index < v; }) - l.mine;
  start[p] = l.k;
  std::vector<uint64_t> cnt_out(p), cnt_in(p);
  for (int q = 0; q < p; ++q) cnt_out[q] = start[q + 1] - start[q];
  std::vector<Request*> sends, recvs;
  uint64_t sent = 0;
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    recvs.push_back(ctx.irecv(q, &cnt_in[q], 8));
    sends.push_back(ctx.isend(q, &cnt_out[q], 8));
    sent += 8;
  }
  ctx.waitAll(recvs);
  recvs.clear();
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    if (cnt_in[q] > l.k)
      throw Error(Error::kPeerFailure, "allreduce (top-k): rank " + std::to_string(q) + " announced " +
                                           std::to_string(cnt_in[q]) + " pairs, at most " + std::to_string(l.k));
    if (cnt_in[q]) recvs.push_back(ctx.irecv(q, l.pairs + q * l.k, cnt_in[q] * sizeof(Pair)));
    if (cnt_out[q]) sends.push_back(ctx.isend(q, l.mine + start[q], cnt_out[q] * sizeof(Pair)));
    sent += cnt_out[q] * sizeof(Pair);
  }
  ctx.waitAll(recvs);
  float* out = static_cast<float*>(a.recvbuf);
  const size_t lo = reg.offset(r), hi = lo + reg.size(r);
  std::memset(out + lo, 0, (hi - lo) * 4);
  for (int q = 0; q < p; ++q) {
    if (q == r) addPairs(out, l.mine + start[r], cnt_out[r], lo, hi, q);
    else addPairs(out, l.pairs + q * l.k, cnt_in[q], lo, hi, q);
  }
  auto mod = [p](int x) { return ((x % p) + p) % p; };
  const int right = mod(r + 1), left = mod(r - 1);
  for (int s = 0; s < p - 1; ++s) {
    const int sb = mod(r - s), rb = mod(r - s - 1);
    sends.push_back(ctx.isend(right, out + reg.offset(sb), reg.size(sb) * 4));
    sent += reg.size(sb) * 4;
    ctx.wait(ctx.irecv(left, out + reg.offset(rb), reg.size(rb) * 4));
  }
  ctx.waitAll(sends);
  a.compress.engine->bytes_sent.fetch_add(sent, std::memory_order_relaxed);
}

double topkRsCost(double n, double kbytes, int p, const TransportParams& t) {
  const double f = (p - 1.0) / p;
  return 3 * (p - 1) * t.alpha + (kbytes * f + n * f) * t.beta + (6 * n + 4 * kbytes) * t.gamma;
}

double topkCost(double n, double kbytes, int p, const TransportParams& t) {
  return (p - 1) * t.alpha + (p - 1) * kbytes * t.beta + (6 * n + 4 * p * kbytes) * t.gamma;
}

}  // namespace harp
