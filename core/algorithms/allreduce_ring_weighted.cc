// Allreduce, ring with chunks sized to the links (for hosts whose links differ:
// a slow or shared NIC, a noisy neighbour).
//
// In the ring (core/algorithms/ring.h) rank r sends 2n - b(r+1) - b(r+2) bytes
// to r+1, for chunk sizes b: with equal chunks every link carries 2(p-1)/p·n,
// so one link at half rate makes the whole ring take twice as long. Sizing the
// chunks so that the two chunks a slow link's sender skips are large moves the
// bytes off that link: with one of four links at half rate the ring then takes
// 2n/B instead of 3n/B (1.5 x faster). No allreduce can do better there: the
// slow host must send and receive n bytes at B/2 whatever the algorithm, so
// 2n/B is the floor (an all-healthy ring takes 1.5n/B).
//
// Steps:
//  1. Probe (the first call on a communicator, then after
//     HARP_RING_PROBE_EVERY calls; while probes keep finding equal links the
//     interval doubles, up to 16 x, and a probe that finds them unequal sets
//     it back: on a healthy network the probe's ~2 x 5 MB per link costs
//     0.2% of 4 MB calls instead of 3%, and a slow host is found within
//     16 x HARP_RING_PROBE_EVERY calls): each rank tells its left neighbour it is
//     ready, and on its right neighbour's word sends it 1 MB and
//     HARP_RING_PROBE_BYTES back to back; each rank times both from its own
//     "ready": the rate of the link from its left, never above it (one round
//     trip of latency and a late sender only lower it). Twice, the faster
//     kept: the first round also warms the connection's window, and a rank
//     not scheduled on a busy host lowers one round, not both. Each round
//     starts with a barrier (a Bruck allgather of a dummy), so no sender comes
//     late from the last round's slower link.
//     The p rates travel to every rank by a Bruck allgather (ceil(log2 p)
//     rounds of doubles), so every rank holds the same figures.
//     HARP_RING_LINK_RATES=r0,r1,... states the rates instead (relative
//     figures suffice: a known slow host, a reproducible benchmark): each rank
//     takes its own entry, the rate of its link to the next rank, and the same
//     allgather makes every rank use one layout even where the variable differs.
//  2. Layout (every rank alike, from those figures): the chunk fractions that
//     minimise max_r (2 - f(r+1) - f(r+2)) / link(r), a small linear program
//     solved by bisection on the time (ringChunkFractions, below); equal
//     chunks when the rates lie within 15% of each other (then this is the
//     ring exactly, plus the probes).
//  3. The ring on those chunks.
// Restrictions: two or more hosts (on one host every link is memory: the plain
// ring), fallback ring; p <= 2 never probes (both chunks' bytes cross every
// link whatever the layout). Any count, in place or not, every dtype and op.
// Cost: the ring's (equal links assumed, as the model knows no per-link rate)
// plus the probe's (2 x (1 MB + HARP_RING_PROBE_BYTES) per link, about
// 2 + 3 ceil(log2 p) latencies) spread over HARP_RING_PROBE_EVERY calls (the
// shortest interval: the model does not assume the links stay equal).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>

#include "base/env.h"
#include "base/log.h"
#include "core/algorithms/ring.h"

namespace harp {
namespace {

constexpr double kTolerance = 1.15;     // rates within 15%: equal chunks (noise does not move bytes)
constexpr size_t kMarkBytes = 1 << 20;  // the first probe message (a marker the receiver waits for, then the rest)
constexpr int kProbeRounds = 2;         // a probe times each link twice and keeps the faster
constexpr int kMaxBackoff = 16;         // the probe interval grows to at most 16 x HARP_RING_PROBE_EVERY

struct WeightedRingState {
  uint64_t calls = 0;
  long long every = -1;            // HARP_RING_PROBE_EVERY, read on first use
  uint64_t next = 0;               // the call that probes next
  long long interval = 0;          // calls from one probe to the next (every .. kMaxBackoff x every)
  std::vector<double> fractions;   // empty: equal chunks
};

bool allEqual(const std::vector<double>& f) {
  for (size_t i = 1; i < f.size(); ++i)
    if (f[i] != f[0]) return false;
  return true;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bruck allgather of one double per rank: out[i] is rank i's value.
std::vector<double> allgatherDoubles(Context& ctx, double mine) {
  const int p = ctx.size(), r = ctx.rank();
  std::vector<double> rot(p);  // rot[i]: rank (r + i) mod p
  rot[0] = mine;
  for (int k = 1; k < p; k <<= 1) {
    const int cnt = std::min(k, p - k);
    Request* s = ctx.isend((r - k + p) % p, rot.data(), cnt * sizeof(double));
    Request* v = ctx.irecv((r + k) % p, rot.data() + k, cnt * sizeof(double));
    ctx.waitAll({s, v});
  }
  std::vector<double> out(p);
  for (int i = 0; i < p; ++i) out[(r + i) % p] = rot[i];
  return out;
}

// HARP_RING_LINK_RATES: this rank's entry (the rate of its link to rank r+1);
// 0 when the variable is unset, -1 (and `problem` says why) when it is malformed.
double statedRate(int rank, std::string& problem) {
  const std::string v = env::str("HARP_RING_LINK_RATES");
  if (v.empty()) return 0;
  size_t at = 0;
  for (int i = 0;; ++i) {
    const size_t end = std::min(v.find(',', at), v.size());
    if (i == rank) {
      const std::string item = v.substr(at, end - at);
      char* stop = nullptr;
      const double x = std::strtod(item.c_str(), &stop);
      if (!item.empty() && *stop == '\0' && x > 0 && std::isfinite(x)) return x;
      problem = "entry " + std::to_string(rank) + " '" + item + "' is not a positive rate";
      return -1;
    }
    if (end == v.size()) {
      problem = "it has " + std::to_string(i + 1) + " rates, none for rank " + std::to_string(rank);
      return -1;
    }
    at = end + 1;
  }
}

std::string rankList(const std::vector<double>& v, bool (*pick)(double)) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    if (pick(v[i])) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out;
}

// Step 1: every link's rate, link[r] from r to r+1. Every rank first tells every
// rank its HARP_RING_LINK_RATES entry (a Bruck allgather), so all ranks decide
// alike: all stated, those rates (each rank's own entry, so a layout is one
// even where the environments differ); none, the probe (bytes/s); a malformed
// entry or a mix, InvalidArgument on every rank, naming the ranks. Empty if a
// rank could not time its link (a zero interval: the data was there before it
// looked).
std::vector<double> linkRates(Context& ctx) {
  const int p = ctx.size(), r = ctx.rank();
  std::string problem;
  const std::vector<double> stated = allgatherDoubles(ctx, statedRate(r, problem));
  const std::string bad = rankList(stated, [](double x) { return x < 0; });
  if (!bad.empty())
    throw InvalidArgument("allreduce ring_weighted: HARP_RING_LINK_RATES is malformed on rank(s) " + bad +
                          (problem.empty() ? "" : " (here: " + problem + ")") +
                          "; it takes one positive rate per rank, r0,r1,...: rank r's link to rank r+1");
  const std::string unset = rankList(stated, [](double x) { return x == 0; });
  const std::string set = rankList(stated, [](double x) { return x > 0; });
  if (!unset.empty() && !set.empty())
    throw InvalidArgument("allreduce ring_weighted: HARP_RING_LINK_RATES is set on rank(s) " + set + " but not on " +
                          unset + "; set it on every rank or on none");
  if (unset.empty()) return stated;
  const int left = (r - 1 + p) % p, right = (r + 1) % p;
  const size_t big = std::clamp<size_t>(env::bytes("HARP_RING_PROBE_BYTES"), kMarkBytes, size_t{256} << 20);
  char* buf = static_cast<char*>(ctx.scratch(2 * (kMarkBytes + big)));
  char* in = buf;                       // [mark | big] from the left
  char* out = buf + kMarkBytes + big;   // [mark | big] to the right
  std::memset(out, 0, kMarkBytes + big);
  double from_left = 0;
  for (int round = 0; round < kProbeRounds; ++round) {
    // Every rank starts the round together (a barrier: the Bruck allgather of a
    // dummy), so no sender comes late to it from the last round's slower link.
    allgatherDoubles(ctx, 0);
    char ready = 1, ready_in = 0;
    // The right neighbour's "ready" first: with p = 2 it shares the pair with the data.
    Request* go = ctx.irecv(right, &ready_in, 1);
    Request* mark = ctx.irecv(left, in, kMarkBytes);
    Request* data = ctx.irecv(left, in + kMarkBytes, big);
    const double t0 = now();  // this rank runs now: a late sender or a cold window can only slow the figure
    Request* told = ctx.isend(left, &ready, 1);
    ctx.wait(go);
    Request* s1 = ctx.isend(right, out, kMarkBytes);
    Request* s2 = ctx.isend(right, out + kMarkBytes, big);
    ctx.wait(mark);
    ctx.wait(data);
    const double dt = now() - t0;
    ctx.waitAll({told, s1, s2});
    // Timed from this rank's "ready", so the figure never exceeds the link (a clock
    // started at the first message's end could start late, with bytes already
    // buffered); it errs low only (a sender not scheduled, a cold window, the
    // latency): the best round counts.
    if (dt > 0) from_left = std::max(from_left, static_cast<double>(kMarkBytes + big) / dt);
  }
  std::vector<double> in_rate = allgatherDoubles(ctx, from_left);  // in_rate[j]: link j-1 -> j
  std::vector<double> link(p);
  for (int j = 0; j < p; ++j) {
    link[j] = in_rate[(j + 1) % p];
    if (!(link[j] > 0) || !std::isfinite(link[j])) return {};
  }
  return link;
}

// The smallest total of x >= 0 with x[j] + x[j+1] >= d[j] (cyclic), given x[0] = v;
// fills x. Greedy forward is optimal for the path; the last pair's deficit goes
// to x[p-1].
double coverFrom(double v, const std::vector<double>& d, std::vector<double>& x) {
  const size_t p = d.size();
  x[0] = v;
  for (size_t j = 0; j + 1 < p; ++j) x[j + 1] = std::max(0.0, d[j] - x[j]);
  x[p - 1] += std::max(0.0, d[p - 1] - x[p - 1] - x[0]);
  double sum = 0;
  for (double e : x) sum += e;
  return sum;
}

// The cheapest cover over x[0] (convex in it: ternary search); x gets the cover.
double cheapestCover(const std::vector<double>& d, std::vector<double>& x) {
  double lo = 0, hi = 0;
  for (double e : d) hi = std::max(hi, e);
  std::vector<double> tmp(d.size());
  for (int it = 0; it < 100 && hi - lo > 1e-12; ++it) {
    const double m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
    if (coverFrom(m1, d, tmp) <= coverFrom(m2, d, tmp))
      hi = m2;
    else
      lo = m1;
  }
  return coverFrom(lo, d, x);
}

}  // namespace

double ringLinkTime(const std::vector<double>& f, const std::vector<double>& link) {
  const size_t p = f.size();
  double t = 0;
  for (size_t r = 0; r < p; ++r) t = std::max(t, (2 - f[(r + 1) % p] - f[(r + 2) % p]) / link[r]);
  return t;
}

std::vector<double> ringChunkFractions(const std::vector<double>& link, double tolerance) {
  const size_t p = link.size();
  std::vector<double> equal(p, p ? 1.0 / p : 0);
  if (p <= 2) return equal;
  const auto [mn, mx] = std::minmax_element(link.begin(), link.end());
  if (!(*mn > 0) || !std::isfinite(*mx) || *mx <= *mn * tolerance) return equal;
  // Time T is feasible when fractions exist with f(r+1) + f(r+2) >= 2 - T·link(r)
  // and sum f <= 1 (any rest can go anywhere). Every rank sends at least one
  // vector (its two skipped chunks are at most all of it): T >= 1 / link(r).
  double lo = 0, hi = ringLinkTime(equal, link);
  for (double l : link) lo = std::max(lo, 1 / l);
  std::vector<double> d(p), x(p), best = equal;
  for (int it = 0; it < 60; ++it) {
    const double t = (lo + hi) / 2;
    for (size_t j = 0; j < p; ++j) d[j] = 2 - t * link[(j + p - 1) % p];  // pair (j, j+1): link j-1's sender
    if (cheapestCover(d, x) <= 1) {
      hi = t;
      best = x;
    } else {
      lo = t;
    }
  }
  double sum = 0;
  for (double e : best) sum += e;
  if (!(sum <= 1)) return equal;
  for (double& e : best) e += (1 - sum) / p;
  return ringLinkTime(best, link) < ringLinkTime(equal, link) ? best : equal;
}

std::vector<size_t> ringChunkSizes(const std::vector<double>& f, size_t count) {
  const size_t p = f.size();
  std::vector<size_t> sizes(p);
  std::vector<double> frac(p);
  size_t given = 0;
  for (size_t i = 0; i < p; ++i) {
    const double want = std::max(0.0, f[i]) * static_cast<double>(count);
    sizes[i] = std::min(count - given, static_cast<size_t>(want));
    given += sizes[i];
    frac[i] = want - static_cast<double>(sizes[i]);
  }
  std::vector<size_t> order(p);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return frac[a] > frac[b]; });
  for (size_t k = 0; given < count; k = (k + 1) % p, ++given) ++sizes[order[k]];
  return sizes;
}

namespace {

void allreduceRingWeighted(Context& ctx) {
  const CollArgs& a = ctx.args();
  const int p = ctx.size();
  if (p <= 2 || a.count == 0) return allreduceRing(ctx);
  auto& st = ctx.algorithmState<WeightedRingState>(reinterpret_cast<const void*>(&allreduceRingWeighted));
  if (st.every < 0) st.every = std::max<long long>(0, env::integer("HARP_RING_PROBE_EVERY"));
  if (st.calls == st.next) {
    const std::vector<double> link = linkRates(ctx);
    const bool was_equal = st.calls > 0 && allEqual(st.fractions);
    st.fractions = link.empty() ? std::vector<double>() : ringChunkFractions(link, kTolerance);
    // Every rank holds the same rates (the allgather), so every rank moves `next` alike.
    if (st.every > 0) {
      const bool equal = allEqual(st.fractions);
      st.interval = equal && was_equal ? std::min(st.interval * 2, kMaxBackoff * st.every) : st.every;
      st.next = st.calls + static_cast<uint64_t>(st.interval);
    } else {
      st.next = UINT64_MAX;  // 0: only the first call probes
    }
    if (ctx.rank() == 0 && logLevel() >= LogLevel::kInfo) {
      std::string text;
      for (size_t i = 0; i < link.size(); ++i)
        text += (i ? " " : "") + std::to_string(static_cast<long long>(link[i] / 1e6));
      std::string fr;
      for (size_t i = 0; i < st.fractions.size(); ++i) {
        char b[32];
        std::snprintf(b, sizeof b, "%s%.3f", i ? " " : "", st.fractions[i]);
        fr += b;
      }
      HARP_INFO_S(LogSubsys::kTuning,
                  "allreduce ring_weighted: links (MB/s, rank r to r+1) %s; chunk fractions %s; next probe in %lld calls",
                  link.empty() ? "unmeasured" : text.c_str(), fr.c_str(),
                  st.next == UINT64_MAX ? -1LL : static_cast<long long>(st.next - st.calls));
    }
  }
  ++st.calls;
  if (allEqual(st.fractions)) return ringAllreduce(ctx, Blocks{a.count, static_cast<size_t>(p)});
  ringAllreduce(ctx, SizedChunks(ringChunkSizes(st.fractions, a.count)));
}

// The ring's time plus the probe's share: twice a barrier, a round trip and 1 MB +
// 4 MB per link (the default HARP_RING_PROBE_BYTES), then the rates' allgather,
// every 64 calls.
double ringWeightedCost(double n, int p, const TransportParams& t) {
  const double probe = kProbeRounds * ((1 + ceilLog2(p)) * t.alpha + (kMarkBytes + (4 << 20)) * t.beta) +
                       ceilLog2(p) * t.alpha;
  return ringAllreduceCost(n, p, t) + probe / 64;
}

}  // namespace

HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "ring_weighted", .fn = allreduceRingWeighted,
                         .restrictions = {.min_hosts = 2}, .cost = ringWeightedCost, .fallback = "ring"});

}  // namespace harp
