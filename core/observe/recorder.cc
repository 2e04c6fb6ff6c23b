// core/observe/recorder.cc — the Recorder's ring, counters and metrics, and the stall
// check built on its counters (see core/observe/recorder.h).
#include "core/observe/recorder.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/algorithms/algorithm.h"
#include "base/env.h"
#include "base/log.h"
#include "bootstrap/socket.h"
#include "bootstrap/store.h"
#include "core/engine/call.h"

namespace harp::obs {
namespace {

uint64_t realtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

struct Calibration {
  double ns_per_tick = 1.0;
  uint64_t tick0 = 0, epoch_ns0 = 0;
};

// Ticks against CLOCK_MONOTONIC over ~2 ms, once.
const Calibration& calibration() {
  static const Calibration c = [] {
    Calibration k;
    auto t0 = std::chrono::steady_clock::now();
    k.tick0 = ticks();
    k.epoch_ns0 = realtimeNs();
#if defined(__x86_64__) || defined(__i386__)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    uint64_t t1 = ticks();
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    if (t1 > k.tick0 && ns > 0) k.ns_per_tick = ns / static_cast<double>(t1 - k.tick0);
#endif
    return k;
  }();
  return c;
}

int bucketOf(uint64_t dt) {
  int b = 63 - __builtin_clzll(dt | 1);
  return b < kHistBuckets ? b : kHistBuckets - 1;
}

inline void bump(std::atomic<uint64_t>& a, uint64_t d) {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

std::string counterKey(int rank) { return "harp.obs.counters." + std::to_string(rank); }

}  // namespace

std::atomic<uint64_t> g_coarse_ticks{0};

double nsPerTick() { return calibration().ns_per_tick; }

uint64_t ticksToEpochNs(uint64_t t) {
  const Calibration& c = calibration();
  double d = (static_cast<double>(t) - static_cast<double>(c.tick0)) * c.ns_per_tick;
  return static_cast<uint64_t>(static_cast<double>(c.epoch_ns0) + d);
}

const char* stateName(uint8_t s) {
  switch (s) {
    case kStarted: return "started";
    case kCompleted: return "completed";
    case kFailed: return "failed";
    default: return "scheduled";
  }
}

Recorder::Recorder(Identity id, size_t entries, std::shared_ptr<Store> store)
    : id_(std::move(id)), ring_(std::max<size_t>(entries, 1)), cells_(new MetricCell[256]), store_(std::move(store)) {
  hot_.ring = ring_.data();
  hot_.cells = cells_.get();
  hot_.size = static_cast<uint32_t>(ring_.size());  // at most 2^24 (attachRecorder)
  const long long every = std::clamp<long long>(env::integer("HARP_FR_TIME_EVERY"), 1, 1 << 30);
  uint32_t period = 1;
  while (period < every) period <<= 1;
  hot_.sample_mask = period - 1;
  hot_.time_bytes = static_cast<uint32_t>(std::min<size_t>(env::bytes("HARP_FR_TIME_BYTES"), UINT32_MAX));
  calibration();
  tickCoarseClock();  // until the publisher thread ticks it
  for (int r = 0; r < id_.size; ++r) global_ranks_.push_back(r);
}

void Recorder::endTimed(MetricCell& m, uint64_t took, uint64_t bytes) {
  bump(m.timed, 1);
  bump(m.timed_bytes, bytes);
  bump(m.ticks, took);
  bump(m.hist[bucketOf(took)], 1);
}

namespace {
bool copySlot(const OpRecord& r, OpSnapshot* s) {
  uint64_t id = r.id.load(std::memory_order_acquire);
  if (id == 0) return false;
  s->id = id - 1;
  s->seq = r.seq;
  s->p2p_seq = r.p2p_seq;
  s->coll = r.coll;
  s->dtype = r.dtype;
  s->op = r.op;
  s->peer = r.peer;
  s->root = r.root;
  s->count = r.count;
  const Algorithm* a = r.algo;
  s->t_start = r.t_start;
  s->timed = r.timed != 0;
  s->state = r.state.load(std::memory_order_acquire);  // end() stores t_end before the state
  s->t_end = s->state == kStarted ? 0 : r.t_end.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (r.id.load(std::memory_order_relaxed) != id) return false;
  s->algo = a && a->name ? a->name : "";
  return true;
}
}  // namespace

bool Recorder::inFlight(OpSnapshot* out) const {
  const uint64_t n = hot_.next_id.load(std::memory_order_acquire);  // the last call's slot: id % size
  return n && copySlot(ring_[(n - 1) % ring_.size()], out) && out->id == n - 1 && out->state == kStarted;
}

std::vector<OpSnapshot> Recorder::snapshot() const {
  std::vector<OpSnapshot> v;
  v.reserve(ring_.size());
  for (const OpRecord& r : ring_) {
    OpSnapshot s;
    if (copySlot(r, &s)) v.push_back(std::move(s));
  }
  std::sort(v.begin(), v.end(), [](const OpSnapshot& a, const OpSnapshot& b) { return a.id < b.id; });
  return v;
}

std::vector<int> Recorder::globalRanks() const {
  std::lock_guard<std::mutex> g(mu_);
  return global_ranks_;
}

void Recorder::setGlobalRanks(std::vector<int> g) {
  std::lock_guard<std::mutex> l(mu_);
  if (static_cast<int>(g.size()) == id_.size) global_ranks_ = std::move(g);
}

// Counters as text: "<last started> <last completed> <ops recorded>".
void Recorder::publish(bool background) {
  std::shared_ptr<Store> s;
  std::string v = std::to_string(started()) + " " + std::to_string(completed()) + " " + std::to_string(ops());
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!store_ || v == last_published_ || (background && !store_->diagnostics())) return;
    s = store_;
    last_published_ = v;
  }
  try {
    s->set(counterKey(id_.rank), v);
  } catch (const std::exception& e) {
    HARP_TRACE("op counters not published: %s", e.what());
  }
}

std::vector<std::string> Recorder::readCounters(double timeout_s) {
  std::vector<std::string> out(id_.size);
  std::shared_ptr<Store> s;
  {
    std::lock_guard<std::mutex> g(mu_);
    s = store_;
  }
  if (!s) return out;
  std::vector<std::string> keys;
  for (int r = 0; r < id_.size; ++r) keys.push_back(counterKey(r));
  try {
    std::vector<bool> have = s->diagnostics() ? s->check(keys) : std::vector<bool>(keys.size(), true);
    const double each = s->diagnostics() ? timeout_s : timeout_s / std::max(1, id_.size);
    for (int r = 0; r < id_.size; ++r) {
      if (!have[r]) continue;
      try {
        out[r] = s->get(keys[r], each);
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception& e) {
    HARP_TRACE("op counters not read: %s", e.what());
  }
  return out;
}

bool Recorder::claimDump() { return !dumped_.exchange(true); }

void Recorder::requestDumps(const std::string& why) {
  std::shared_ptr<Store> s;
  {
    std::lock_guard<std::mutex> g(mu_);
    s = store_;
  }
  if (!s) return;
  try {
    s->setIfAbsent("harp.obs.dump", "rank " + std::to_string(id_.rank) + ": " + why.substr(0, 2000));
  } catch (const std::exception& e) {
    HARP_TRACE("dump request not stored: %s", e.what());
  }
}

void Recorder::pollDumpRequest() {
  std::shared_ptr<Store> s;
  {
    std::lock_guard<std::mutex> g(mu_);
    s = store_;
  }
  if (!s || !s->diagnostics() || dumped_.load()) return;
  try {
    if (!s->check({"harp.obs.dump"}).at(0)) return;
    std::string why = s->get("harp.obs.dump", 1.0);
    if (!claimDump()) return;
    std::string err, path = dumpFlightRecord("dump requested by " + why, &err);
    if (path.empty()) HARP_WARN("flight record not written: %s", err.c_str());
    else HARP_WARN("flight record written to %s (requested by %s)", path.c_str(), why.substr(0, 200).c_str());
  } catch (const std::exception& e) {
    HARP_TRACE("dump request not read: %s", e.what());
  }
}

void Recorder::detachStore() {
  std::lock_guard<std::mutex> g(mu_);
  store_.reset();
}

std::shared_ptr<Store> Recorder::store() const {
  std::lock_guard<std::mutex> g(mu_);
  return store_;
}

void Recorder::setJobAddrs(std::vector<std::string> a) {
  std::lock_guard<std::mutex> g(mu_);
  job_addrs_ = std::move(a);
}

void Recorder::setLinks(std::vector<transport::Transport*> of, std::vector<char> same_host) {
  std::lock_guard<std::mutex> g(links_mu_);
  links_of_ = std::move(of);
  links_local_ = std::move(same_host);
}

std::vector<std::string> Recorder::jobAddrs() const {
  std::lock_guard<std::mutex> g(mu_);
  return job_addrs_;
}

void Recorder::setStallView(std::string v) {
  std::lock_guard<std::mutex> g(mu_);
  stall_view_ = std::move(v);
}

std::string Recorder::stallView() {
  std::lock_guard<std::mutex> g(mu_);
  return stall_view_;
}

// ---------------------------------------------------------------------------
// Stall check

double stallWarningSeconds(double timeout_s) {
  double w = env::timeout("HARP_STALL_WARNING_S");
  return std::min(w, timeout_s / 2);
}

namespace {

// "ranks that have not started #5: 2 (last completed #4), 3 (no counters)"; ""
// when every rank that published has started `seq`.
std::string lagging(Recorder* r, uint32_t seq, std::vector<int>* missing) {
  r->publish();
  auto vals = r->readCounters(0.5);
  std::string s;
  for (int q = 0; q < static_cast<int>(vals.size()); ++q) {
    if (q == r->identity().rank) continue;
    unsigned long long st = 0, done = 0;
    std::string what;
    if (vals[q].empty() || std::sscanf(vals[q].c_str(), "%llu %llu", &st, &done) != 2) {
      what = std::to_string(q) + " (no counters published)";
    } else if (st < seq) {
      what = std::to_string(q) + " (last started #" + std::to_string(st) + ", last completed #" +
             std::to_string(done) + ")";
    } else {
      continue;
    }
    if (missing) missing->push_back(q);
    s += (s.empty() ? "" : ", ") + what;
  }
  return s;
}

}  // namespace

void stallCheck(Recorder* r, double waited_s, const std::string& waiting_for) {
  if (!r) return;
  OpSnapshot op;
  if (!r->inFlight(&op) || op.seq == 0) return;  // point-to-point: no common count
  std::string lag = lagging(r, op.seq, nullptr);
  std::string name = std::string(collName(static_cast<CollType>(op.coll))) + " #" + std::to_string(op.seq);
  std::string view = lag.empty() ? "" : "Missing ranks (have not started " + name + "): " + lag;
  r->setStallView(view);
  HARP_WARN("stall: %s on rank %d has waited %s s of its %s s timeout for rank(s) %s. %s", name.c_str(),
            r->identity().rank, formatSeconds(waited_s).c_str(), formatSeconds(r->identity().timeout_s).c_str(),
            waiting_for.c_str(),
            view.empty() ? "Every rank has started it (a slow or stuck peer, not a missing call)." : view.c_str());
}

std::string withOpCounts(Recorder* r, const std::string& what) {
  if (!r || what.find("timed out") == std::string::npos || what.find("Missing ranks") != std::string::npos)
    return what;
  OpSnapshot op;
  if (!r->inFlight(&op) || op.seq == 0) return what;
  std::string lag = lagging(r, op.seq, nullptr);
  if (lag.empty()) return what;
  return what + "; op counts disagree. Missing ranks (have not started " +
         std::string(collName(static_cast<CollType>(op.coll))) + " #" + std::to_string(op.seq) + "): " + lag;
}

}  // namespace harp::obs
