// core/observe/recorder.h — the flight recorder, operation counters and metrics of one
// communicator.
//
// Every communicator owns a Recorder (unless HARP_FR_ENTRIES=0): a ring of the
// last HARP_FR_ENTRIES operations, preallocated at creation, that
// the call pipeline (core/engine/pipeline.h, its run stage) fills through one OpScope per call:
//
//   obs::OpScope rec(recorder_.get(), a, algo, user_dtype, d.seq);  // slot written, state "started"
//   ... run the algorithm ...
//   rec.ok();                                   // state "completed"; a throw leaves "failed"
//
// A call costs a handful of plain stores into one ring slot (one cache line,
// prefetched by the call before), the counters' cache line and one metrics
// cell: no allocation, lock or syscall. Time: a call of at least
// HARP_FR_TIME_BYTES (64K), and one in HARP_FR_TIME_EVERY (64) of the smaller
// ones, reads the time-stamp counter at start and end (a duration, for the
// latency histogram and the dump's duration_ms); every other call is stamped
// with the process's coarse clock (a plain load of a value the publisher
// thread refreshes every HARP_FR_CLOCK_MS, 10 ms) and has no duration, as
// torch's recorder has none without TORCH_NCCL_ENABLE_TIMING. Why: the two
// counter reads cost ~22 ns on the 2-core VM HARP is measured on, where a
// 2-rank shm 8-byte allreduce takes 0.46 us in C++. Measured there (quiet,
// 2026-12-04, bench/RESULTS-observe.md "The recorder on a quiet machine"): every call recorded,
// the default sampling: +4.5-7 ns, 1.0-1.3% in C++ (bench/recorder_cost.cc; 2.8% in one run
// of nine, where the allreduce took 0.25 us), 1.7% through Python (bench/recorder_overhead.py);
// tcp 0.1-1.3%. Timing every call (HARP_FR_TIME_EVERY=1) about doubles it (session 9: +33 ns
// at load 2.7, where the default measured +15.5 ns). The hardening decision accepts 2.5% on shm
// and 1% on tcp for complete records. The same calls keep the counters
// the stall warning, harp-status and the Prometheus exporter read: the last
// collective started and completed, the operation in flight, and per
// (collective, algorithm) counts, bytes and a log2 latency histogram.
//
// Readers (dumps, status, metrics, the stall check) run on other threads and
// never block the writer: each slot carries its record id, cleared while the
// slot is rewritten, and a reader keeps a copy only when the id is the same
// before and after copying (a seqlock).
//
// Lifetime: made by Communicator::attachRecorder after creation, registered
// in a process-wide list (core/observe/observer.cc reads it for SIGUSR1 dumps, the
// status socket and the counter publisher), retired by destroy(), which also
// drops the store reference. Threading: begin/end only on the thread that
// executes the communicator's collectives; everything else from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#else
#include <chrono>
#endif

namespace harp {

struct Algorithm;
struct CollArgs;
class Store;
namespace transport {
class Transport;
}

namespace obs {

// A cheap monotonic clock: the TSC on x86 (constant and invariant on every
// CPU HARP targets), steady_clock nanoseconds elsewhere.
inline uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}
// The coarse clock: ticks() as of the last tick of the process's publisher
// thread (every HARP_FR_CLOCK_MS; core/observe/observer.cc), read with one plain load.
// It stamps the calls the recorder does not time (see Recorder::begin).
extern std::atomic<uint64_t> g_coarse_ticks;
inline uint64_t coarseTicks() { return g_coarse_ticks.load(std::memory_order_relaxed); }
inline void tickCoarseClock() { g_coarse_ticks.store(ticks(), std::memory_order_relaxed); }
double nsPerTick();             // calibrated once per process (~2 ms, the first time)
uint64_t ticksToEpochNs(uint64_t t);  // CLOCK_REALTIME nanoseconds of a ticks() value

enum OpState : uint8_t { kEmpty = 0, kStarted = 1, kCompleted = 2, kFailed = 3 };
const char* stateName(uint8_t s);

// One ring slot: one cache line, so a call writes one line (prefetched for
// writing by the call before). Plain fields are written before `id` is
// published. The bytes of a call are count x itemsize of `dtype`.
struct alignas(64) OpRecord {
  std::atomic<uint64_t> id{0};  // record id + 1; 0 while (re)written
  uint64_t t_start = 0;
  std::atomic<uint64_t> t_end{0};
  uint64_t count = 0;
  const Algorithm* algo = nullptr;
  uint32_t seq = 0;             // collective sequence number; 0 for point-to-point
  uint32_t p2p_seq = 0;         // point-to-point sequence number; 0 for collectives
  int32_t peer = -1, root = 0;
  uint8_t coll = 0, dtype = 0, op = 0;
  std::atomic<uint8_t> state{kEmpty};
  uint8_t timed = 0;            // 1: t_start/t_end read the time-stamp counter; 0: the coarse clock
  uint8_t cell = 0;             // metrics cell: (coll & 15) x 16 + (algorithm index & 15)
};
static_assert(sizeof(OpRecord) == 64, "one ring slot per cache line");

// A consistent copy of one slot (readers).
struct OpSnapshot {
  uint64_t id = 0;
  uint32_t seq = 0, p2p_seq = 0;
  uint8_t coll = 0, dtype = 0, op = 0, state = 0;
  int32_t peer = -1, root = 0;
  uint64_t count = 0;
  std::string algo;
  uint64_t t_start = 0, t_end = 0;
  bool timed = false;  // the times are the counter's (a duration); else the coarse clock's
};

constexpr int kHistBuckets = 40;  // log2 buckets of ticks: bucket b holds [2^b, 2^(b+1))
// count and bytes: every completed call. timed, timed_bytes, ticks, hist: the
// timed calls only (every call of >= HARP_FR_TIME_BYTES, one in
// HARP_FR_TIME_EVERY of the smaller ones), so the latency histogram and the
// bus bandwidth (timed_bytes / ticks) are of a sample.
struct alignas(64) MetricCell {
  std::atomic<uint64_t> count{0}, bytes{0}, ticks{0}, timed{0}, timed_bytes{0};
  std::atomic<uint64_t> hist[kHistBuckets] = {};
};

// Who the communicator is, for dumps and status (fixed at creation).
struct Identity {
  uint64_t comm_id = 0;
  int rank = 0, size = 1;
  std::vector<std::string> hosts;  // by rank
  std::vector<int> pids;           // by rank
  std::string transport;           // "tcp", "shm", "mixed", "self"
  double timeout_s = 0;
  // The job view (core/observe/jobview.h): the communicator's secret token,
  // never printed or dumped, only keyed into HMACs; the local address that
  // reaches the bootstrap ("" or "[v6]" allowed), where the listener binds.
  std::string secret;
  std::string bind_host;
};

class Recorder {
 public:
  Recorder(Identity id, size_t entries, std::shared_ptr<Store> store);

  // --- the executing thread (through OpScope) ---
  // Inline (a call through the PLT and the saved registers were a third of
  // the hook). Args: CollArgs (coll, op, peer, root, count); Algo: Algorithm
  // (index); templates so that this header needs neither definition.
  template <class Args, class Algo>
  OpRecord* begin(const Args& a, const Algo* algo, DataType dt, uint32_t seq);
  void end(OpRecord* r, bool ok);

  // Benchmarks only (bench/recorder_overhead.py, bench/recorder_cost.cc):
  // while paused, calls are not recorded, counted or timed, so "recorder on"
  // and "off" can alternate on one communicator in one run. The op counters
  // stop too: the stall view and status are wrong while paused. Any thread.
  void setPaused(bool p) { hot_.paused.store(p, std::memory_order_relaxed); }
  bool recording() const { return !hot_.paused.load(std::memory_order_relaxed); }

  // --- any thread ---
  const Identity& identity() const { return id_; }
  uint32_t started() const { return hot_.started.load(std::memory_order_relaxed); }
  uint32_t completed() const { return hot_.completed.load(std::memory_order_relaxed); }
  uint64_t ops() const { return hot_.next_id.load(std::memory_order_relaxed); }
  size_t capacity() const { return ring_.size(); }
  bool inFlight(OpSnapshot* out) const;      // the operation running now, if any
  std::vector<OpSnapshot> snapshot() const;  // the ring, oldest first
  // Metrics cell of (collective, algorithm index): 16 x 16 cells.
  const MetricCell& cell(int coll, int algo) const { return cells_[(coll & 15) * 16 + (algo & 15)]; }

  // Global ranks of this communicator's ranks, for the dump's pg_config
  // (identity unless a split told otherwise).
  std::vector<int> globalRanks() const;
  void setGlobalRanks(std::vector<int> g);

  // The op-count view through the store (core/observe/observer.cc): publish this
  // rank's counters; read every rank's ("" for a rank that never published).
  // background: the publisher thread, which leaves stores without
  // diagnostics() (the torch adapter calls Python) to the executing thread.
  void publish(bool background = false);
  std::vector<std::string> readCounters(double timeout_s);
  void detachStore();  // destroy(): the store may close now
  std::shared_ptr<Store> store() const;  // null once detached

  // Every rank's job-view address by rank ("" where a rank serves none), set
  // once at registration (core/observe/jobview.h).
  void setJobAddrs(std::vector<std::string> a);
  std::vector<std::string> jobAddrs() const;

  // The job view's links: by peer rank, the transport serving it (nullptr:
  // this rank) and whether the peer shares this rank's host. Set at creation;
  // cleared (empty vectors) by destroy() before its transports go, so
  // withLinks(f), which runs f(transport_of, same_host) under the lock that
  // clearing takes, never sees a transport that is gone.
  void setLinks(std::vector<transport::Transport*> of, std::vector<char> same_host);
  template <class F>
  void withLinks(F&& f) const {
    std::lock_guard<std::mutex> g(links_mu_);
    f(links_of_, links_local_);
  }

  // Dumps on every rank at the moment one fails (like torch's dump-on-timeout
  // signal through the store): the failing rank writes its own dump and sets
  // a key; every rank's publisher thread finds it within HARP_OBS_PUBLISH_S
  // and dumps too. One dump per communicator and process: a later failure of
  // the rank that was asked does not overwrite the record of the hang.
  bool claimDump();                    // true the first time
  void requestDumps(const std::string& why);
  void pollDumpRequest();              // the publisher thread

  // Stall view: set by the stall check, appended to the timeout error.
  void setStallView(std::string v);
  std::string stallView();

 private:
  // What begin/end touch besides one ring slot and one metrics cell, in one
  // cache line. Written by the executing thread only.
  struct alignas(64) Hot {
    OpRecord* ring = nullptr;
    MetricCell* cells = nullptr;
    std::atomic<uint64_t> next_id{0};
    uint64_t spare = 0;  // was the in-flight pointer; inFlight() reads slot next_id - 1
    uint32_t slot = 0, size = 0;  // next slot; ring size
    uint32_t p2p_seq = 0;
    std::atomic<uint32_t> started{0}, completed{0};
    std::atomic<bool> paused{false};
    uint32_t sample_mask = 0;  // a small call is timed when (record id & sample_mask) == 0
    uint32_t time_bytes = 0;   // calls of at least this many bytes are always timed
  };
  static_assert(sizeof(Hot) == 64, "one cache line");
  void endTimed(MetricCell& m, uint64_t took, uint64_t bytes);  // the timed calls' metrics
  Hot hot_;
  Identity id_;
  std::vector<OpRecord> ring_;
  std::unique_ptr<MetricCell[]> cells_;
  mutable std::mutex mu_;                 // the fields below
  std::shared_ptr<Store> store_;
  std::vector<int> global_ranks_;
  std::string stall_view_;
  std::string last_published_;
  std::vector<std::string> job_addrs_;
  mutable std::mutex links_mu_;  // the two below (not mu_: the transports are asked under it)
  std::vector<transport::Transport*> links_of_;
  std::vector<char> links_local_;
  std::atomic<bool> dumped_{false};
};

// The hot path: one ring slot (a cache line the previous end() prefetched),
// a few counters of this Recorder and one metrics cell, all written with
// plain stores (x86: release and relaxed stores and the release fence are
// ordinary moves); a timed call (see the top of this file) reads the
// time-stamp counter once each in begin and end, any other call loads the
// coarse clock.
template <class Args, class Algo>
inline OpRecord* Recorder::begin(const Args& a, const Algo* algo, DataType dt, uint32_t seq) {
  Hot& h = hot_;
  const uint64_t id = h.next_id.load(std::memory_order_relaxed);
  OpRecord& r = h.ring[h.slot];
  if (++h.slot == h.size) h.slot = 0;
  r.id.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  r.seq = seq;
  r.p2p_seq = seq ? 0 : ++h.p2p_seq;
  r.coll = static_cast<uint8_t>(a.coll);
  r.dtype = static_cast<uint8_t>(dt);
  r.op = static_cast<uint8_t>(a.op);
  r.peer = a.peer;
  r.root = a.root;
  r.count = a.count;
  r.algo = algo;
  r.cell = static_cast<uint8_t>((static_cast<unsigned>(a.coll) & 15) * 16 + ((algo ? algo->index : 0) & 15));
  const bool timed = a.count * itemSize(dt) >= h.time_bytes || (id & h.sample_mask) == 0;
  r.timed = timed;
  r.state.store(kStarted, std::memory_order_relaxed);  // t_end is stale until end(): readers take it only when completed or failed
  r.t_start = timed ? ticks() : coarseTicks();
  r.id.store(id + 1, std::memory_order_release);
  h.next_id.store(id + 1, std::memory_order_release);
  if (seq) h.started.store(seq, std::memory_order_relaxed);
  return &r;
}

inline void Recorder::end(OpRecord* r, bool ok) {
  const bool timed = r->timed;
  const uint64_t t = timed ? ticks() : coarseTicks();
  r->t_end.store(t, std::memory_order_relaxed);
  r->state.store(ok ? kCompleted : kFailed, std::memory_order_release);
  Hot& h = hot_;
  __builtin_prefetch(&h.ring[h.slot], 1);  // the next call's slot, while the caller runs
  if (!ok) return;
  if (r->seq) h.completed.store(r->seq, std::memory_order_relaxed);
  MetricCell& m = h.cells[r->cell];
  const uint64_t bytes = r->count * itemSize(static_cast<DataType>(r->dtype));
  m.count.store(m.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  m.bytes.store(m.bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
  if (timed) endTimed(m, t - r->t_start, bytes);
}

// RAII for one call (the pipeline's run stage): marks the record failed unless ok() was called.
class OpScope {
 public:
  template <class Args, class Algo>
  OpScope(Recorder* r, const Args& a, const Algo* algo, DataType dt, uint32_t seq)
      : r_(r), rec_(r && r->recording() ? r->begin(a, algo, dt, seq) : nullptr) {}
  ~OpScope() {
    if (rec_) r_->end(rec_, false);
  }
  void ok() {
    if (rec_) r_->end(rec_, true);
    rec_ = nullptr;
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Recorder* r_;
  OpRecord* rec_;
};

// The process-wide list of live recorders (core/observe/observer.cc).
// The process-wide service (observer and publisher threads, SIGUSR1 pipe,
// status socket) without a communicator; registerRecorder starts it too. It
// lives until the process exits, like NCCL RAS: one per process, not per
// communicator. Tests that count threads and fds per communicator start it first.
void ensureService();
void registerRecorder(const std::shared_ptr<Recorder>& r);
void retireRecorder(const Recorder* r);
std::vector<std::shared_ptr<Recorder>> liveRecorders();  // in creation order

// Flight-recorder dump of every live communicator of this process, in the
// pickle torch's analyser reads (torch/distributed/flight_recorder: fr_trace
// <dir>): one file <HARP_FR_DUMP_PREFIX><global rank>, by default
// <$TMPDIR or /tmp>/harp-trace-<uid>/harp_trace_rank_<rank> (privateFolder).
// The file is made 0600 with O_EXCL beside the target and renamed in: a symlink
// or another user's file at that name is replaced, never written through.
// Returns the path, or "" with *err set. Any thread; `reason` goes into the
// dump's "harp" section.
std::string dumpFlightRecord(const std::string& reason, std::string* err);
std::string flightRecordPickle(const std::string& reason);  // the bytes of that file
int processGlobalRank();  // RANK / HARP_RANK, else the first communicator's rank


// Every live communicator of this process as JSON (harp-status, metrics), and
// the status socket's path ("" when off); core/observe/observer.cc.
std::string statusJson();
std::string statusSocketPath();

// Stall check (Context::waitAll, core/engine/context.cc): called once per wait
// that has lasted HARP_STALL_WARNING_S (never later than half the timeout).
// Publishes this rank's counters, reads everyone's, logs a warning naming
// the ranks that have not started the collective in flight and the last one
// each completed, and keeps the view for the timeout error.
void stallCheck(Recorder* r, double waited_s, const std::string& waiting_for);
double stallWarningSeconds(double timeout_s);
// A failure's text with the op-count view appended ("; op counts disagree.
// Missing ranks (have not started allreduce #5): 2 (last started #4, ...)")
// when it is a timeout (this rank's, or a peer's in its abort notice) and
// some rank has not started the collective in flight; otherwise as is.
std::string withOpCounts(Recorder* r, const std::string& what);

}  // namespace obs
}  // namespace harp
