// core/engine/communicator.h — a group of ranks and the collectives they run.
//
// A Communicator is created collectively by `size` processes (or threads) that
// share a Store (usually through a UniqueId). Creation connects every pair of
// ranks with the best transport that reaches it (HARP_TRANSPORT forces one).
//
// Every collective is submitted with the same arguments, in the same order, on
// every rank. Calls return a Work handle; collectives complete in submission
// order. A blocking call (async=false) on an idle communicator runs directly on
// the calling thread, so small collectives pay no thread hand-off; async calls
// run on the communicator's worker thread, started on first use.
//
// Failures are harp::Error. A local argument error (kInvalidArgument) leaves
// the communicator usable. A mismatch between ranks, a dead peer or a timeout
// breaks the communicator: HARP tells every peer (so they raise too instead of
// waiting), and every later call raises the same error. abort() does that on
// purpose, from any thread.
//
// Threading: the submit methods, split() and destroy() may be called from any
// thread, one call at a time: submission order defines the collective order
// on every rank, so callers that submit from several threads must order the
// calls themselves. Overlapping calls from two threads are detected (an atomic
// owner word, see CallGuard), break the communicator on every rank and raise
// InvalidArgument naming both threads. abort() may come from any thread.
//
// Fork: a communicator belongs to the process that made it. A child forked
// after its creation (multiprocessing "fork", a DataLoader worker) that calls
// it gets InvalidArgument naming both processes, and the parent's job is not
// disturbed; the child's copy, when destroyed or garbage-collected, lets go of
// everything without tearing anything down (base/fork.h). Make a new
// communicator in the child instead.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/store.h"
#include "core/algorithms/group.h"
#include "core/engine/call.h"
#include "core/engine/resources.h"
#include "core/select/cost.h"
#include "core/topology/topology.h"
#include "core/select/tuning.h"
#include "base/fork.h"
#include "base/types.h"
#include "transport/transport.h"

namespace harp {

class Context;
class Communicator;
struct CallPlan;  // core/engine/pipeline.h
class KeepAlive;  // core/ft/keepalive.h
namespace obs {
class Recorder;  // core/observe/recorder.h
class OpScope;
}

class Communicator : public Group, public std::enable_shared_from_this<Communicator> {
 public:
  // Collective: every rank calls with the same store (prefix) and size.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              CommOptions opts = {});
  static std::shared_ptr<Communicator> create(const UniqueId& id, int rank, int size,
                                              CommOptions opts = {});
  ~Communicator();

  int rank() const { return rank_; }
  int size() const override { return size_; }
  double timeout() const { return timeout_s_; }
  // Name of the transport used for `peer` ("self" for this rank).
  std::string transportName(int peer) const;
  // HMAC-SHA256 of msg under a key derived from this communicator's token and
  // `label`, bound to the communicator id: payloads that ranks exchange as
  // plain data (pickled objects, harp.horovod) carry it, so bytes an on-path
  // injector without the token writes are refused before they are parsed.
  // Only as secret as the token (SECURITY.md).
  std::string payloadMac(const std::string& label, const std::string& msg) const;
  // Validate, then run now (async=false, idle communicator) or queue.
  std::shared_ptr<Work> submit(CollArgs args, bool async) override;
  // Blocking submit without a Work object: errors are thrown from here. The
  // per-call path of the bindings (no allocation, no condition variable).
  void run(CollArgs args) override;

  // Convenience wrappers (blocking unless async).
  std::shared_ptr<Work> allreduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                                  CollOptions o = {}, bool async = false);
  std::shared_ptr<Work> broadcast(void* buf, size_t count, DataType dt, int root, CollOptions o = {},
                                  bool async = false);
  std::shared_ptr<Work> barrier(bool async = false);
  // One allreduce schedule over a list of buffers of one dtype
  // (core/algorithms/allreduce_coalesced_ring.cc): no packing copies. Every
  // rank passes the same counts in the same order (checked exactly: a
  // disagreement raises MismatchError on every rank); integer avg is refused.
  std::shared_ptr<Work> allreduceCoalesced(std::vector<BufPiece> pieces, DataType dt, ReduceOp op,
                                           CollOptions o = {}, bool async = false);

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, old rank). color < 0: this rank gets nullptr.
  std::shared_ptr<Communicator> split(int color, int key);

  // Break the communicator on every rank (best effort) and fail pending work.
  // The collective in flight when abort() comes may still complete on peers
  // whose data had all arrived (as with MPI ULFM's revoke and NCCL's
  // ncclCommAbort); it fails here, and every later collective on every rank
  // fails (each needs this rank's data or descriptor).
  void abort(const std::string& reason) override;
  // This rank, the root of rooted collective `c`, refused its own arguments
  // (a root-only buffer of the wrong size) before running it: the
  // other ranks wait in it for the root, so break the communicator on every
  // rank now, quoting `why` (they raise PeerError naming this rank and the
  // reason, not a timeout). Not rooted, or one rank: nothing to do.
  void refuseRooted(CollType c, const std::string& why);
  // Wait for queued work, tell peers goodbye, release everything. Idempotent.
  void destroy() override;
  bool broken() const override { return broken_.load(); }
  std::string brokenReason();

  // Algorithm that would run (core/select/select.h: user, tuning table, cost model,
  // fallback); for tests and INFO logs. In place: sendbuf == recvbuf != null.
  std::string chooseAlgorithm(const CollArgs& a) const;
  // The algorithm the latest call of `c` without algo= ran ("" before one);
  // for tests comparing the runtime pick with chooseAlgorithm / --explain.
  std::string lastAlgorithm(CollType c);

 private:
  Communicator(std::shared_ptr<Store> store, int rank, int size, CommOptions opts);
  // Creation, in order (connectAll runs the steps; each is a short function).
  struct Plan;  // which transports, which peers each serves (communicator.cc)
  void connectAll();
  void drawIdentity();
  std::vector<std::vector<std::string>> exchangeHostInfo(const Plan& plan);
  void adaptSpin();
  void assignPeers(Plan& plan, const std::vector<std::vector<std::string>>& avail) const;
  transport::CommInfo commInfo() const;
  void connectTransports(const Plan& plan, const transport::CommInfo& info);
  // Where a call runs (core/engine/executor.cc).
  void execute(CollArgs& a, Work& w);
  void workerLoop();
  // The call's stages, in order (core/engine/pipeline.h; validate.cc, pipeline.cc).
  // choose/describe/runPlan/finish are inline, defined and used in pipeline.cc
  // only: runStages runs them without calls through the PLT.
  void validate(const CollArgs& a) const;
  void checkBuffers(const CollArgs& a) const;
  void runCollective(CollArgs& a);
  void runIntAvg(CollArgs& a);
  void runStages(CollArgs& a, DataType user_dtype);
  inline void choose(CallPlan& p);
  inline void describe(CallPlan& p);
  inline void runPlan(CallPlan& p, obs::OpScope& recorded);
  [[noreturn]] void failCall(const Error& e, Context* ctx);
  void closingCheck(const CollArgs& a, uint32_t seq, bool deferred);
  inline void finish(CallPlan& p);
  void settleDeferred();  // destroy(): the last deferred descriptor check (core/engine/context.h)
  // Fork (base/fork.h): throws InvalidArgument for `what` in a process forked from the maker.
  // Inline, one load: CallGuard runs it on every call.
  void refuseIfInherited(const char* what) const {
    if (inheritedAcrossFork(made_in_)) [[unlikely]]
      refuseInherited(what);
  }
  [[noreturn]] void refuseInherited(const char* what) const;
  void abandonInherited();  // destroy() in such a process: let go of everything, tear nothing down
  void markBroken(const std::string& why);
  std::shared_ptr<Communicator> splitCreate(const std::vector<int64_t>& all, int color, int seq);

  std::shared_ptr<Store> store_;
  uint64_t made_in_;  // forkGeneration() at creation (base/fork.h)
  int rank_, size_;
  double timeout_s_;
  CommOptions opts_;
  uint64_t comm_id_ = 0;
  std::string token_;
  std::vector<transport::PeerInfo> peers_;
  CommResources res_;  // connections and reused buffers, lent to each Context
  std::string transport_kind_ = "self";              // tuning key: a transport name or "mixed"
  // Configuration read from the environment when the communicator is created.
  TuningTable tuning_;
  Calibration calibration_;    // HARP_CALIBRATION_FILE over the built-in transport parameters
  uint32_t seq_ = 0;
  int split_seq_ = 0;

  // Execution: exec_mu_ serializes running collectives; queue for async work.
  std::mutex exec_mu_;
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<std::pair<CollArgs, std::shared_ptr<Work>>> queue_;
  size_t in_flight_ = 0;  // queued + running async ops
  std::thread worker_;
  bool stop_ = false;

  // Thread inside submit()/run() (OS thread id; 0: none): see CallGuard.
  class CallGuard;
  std::atomic<uint64_t> owner_{0};

  // (last completed collective's seq << 1) | 1 once broken; see closingCheck.
  std::atomic<uint64_t> done_word_{0};
  std::atomic<bool> broken_{false};
  std::mutex broken_mu_;
  std::string broken_reason_;
  Error::Kind broken_kind_ = Error::kInternal;
  bool destroyed_ = false;
  std::vector<std::string> logged_algos_;
  // The selector's last answer per collective (exact byte count, in-place or
  // not, no per-call algo=), so a training loop's repeated calls skip the
  // table walk and the cost model. Touched by the executing thread only
  // (under exec_mu_).
  struct AlgoMemo {
    size_t bytes = 0;
    bool in_place = false;
    int link_flows = 1;  // the rails' calls and the leaders' share rail 0's communicator
    const struct Algorithm* algo = nullptr;  // nullptr: nothing memoised yet
  };
  AlgoMemo algo_memo_[32];
  const struct Algorithm* algorithmFor(const CollArgs& a);

  // Topology: the host map and the sub-communicators of the
  // hierarchical algorithms (core/topology/topology.h; core/engine/communicator_topology.cc).
 public:
  // Which ranks share a host (confirmed keys; the same on every rank).
  const Topology& topology() const { return topo_; }
  // The intra-host and rail communicators, created collectively on the first
  // call. Only for algorithms running a collective of this communicator
  // (Context::subComms): every rank runs that collective, so every rank gets here.
  SubComms& subComms();

 private:
  void confirmHosts(const std::vector<std::string>& nics);
  std::shared_ptr<Communicator> subCreate(const std::string& name, int rank, int size);
  void abortSubComms(const std::string& notice);
  void destroySubComms();
  Topology topo_;
  bool hier_auto_ = true;               // HARP_HIER
  std::mutex subs_mu_;                  // subs_ against abort() from other threads
  std::unique_ptr<SubComms> subs_;      // nullptr until the first hierarchical collective
  // Compression (core/compress/compress.h, defined in core/engine/communicator_compress.cc).
 public:
  // The compression state (HARP_COMPRESS default, residuals, counters); created on first use.
  CompressEngine& compression();

 private:
  // The compressed algorithm `a` runs with, or nullptr for the dense choice.
  const struct Algorithm* compressedAlgorithm(CollArgs& a);
  std::once_flag compress_once_;
  std::shared_ptr<CompressEngine> compress_;
  // Fault tolerance: definitions in core/engine/communicator_ft.cc.
  // Failure detection: a KeepAlive (core/ft/keepalive.h) started at creation
  // reports a dead, frozen or cut-off peer within HARP_KEEPALIVE_TIMEOUT and
  // breaks the communicator naming it, on every rank. The recovery calls below
  // run through the bootstrap store, which must stay alive: its host is the
  // process that made the unique id (harp-run's launcher, or rank 0 for
  // harp.init without a launcher) — like torchft's lighthouse. Every wait in
  // them is bounded by the communicator's timeout.
 public:
  // Break the communicator on every rank: every pending and later operation
  // raises Error::kRevoked ("communicator revoked by rank R"). Any thread;
  // not collective (one rank is enough).
  void revoke();
  bool revoked();
  // Ranks the keep-alive found dead or unreachable so far (sorted).
  std::vector<int> failedRanks() const;
  // Fault-tolerant agreement: every surviving rank calls it; returns the AND
  // of the survivors' flags and the agreed set of failed ranks (the same on
  // every rank that returns). Completes when ranks die during it (they join
  // the failed set once the keep-alive reports them). Works on a broken or
  // revoked communicator.
  struct Agreement {
    bool flag = true;
    std::vector<int> failed;
  };
  Agreement agree(bool flag);
  // Collective over the survivors: a new communicator without `exclude`
  // (nullptr: agree(true).failed), ranks renumbered contiguously in old-rank
  // order. New connections are made (the revoked ones are half-closed).
  // Throws InvalidArgument on an excluded rank that calls it.
  std::shared_ptr<Communicator> shrink(const std::vector<int>* exclude);
  // Collective over this communicator and the joining ranks: a communicator
  // of new_size ranks in which the current ranks keep their numbers and the
  // joiners (which call create(*id, rank, new_size) with rank >= size()) take
  // the rest. Rank 0 passes the fresh id (newUniqueId()); the others may pass
  // nullptr and receive it through the store.
  std::shared_ptr<Communicator> grow(int new_size, const UniqueId* id);
  // A fresh unique id served by this process (ncclCommGetUniqueId).
  static UniqueId newUniqueId();

 private:
  void startKeepAlive();
  void stopKeepAlive();
  std::string ftPrefix(const char* what, uint32_t seq) const;
  std::string keepAliveVerdict(const std::string& failure);
  std::unique_ptr<KeepAlive> keepalive_;
  uint32_t agree_seq_ = 0, shrink_seq_ = 0, grow_seq_ = 0;
  // Observability: flight recorder, op counters and metrics
  // (core/observe/recorder.h); made by attachRecorder() when creation succeeded,
  // retired by destroy(). core/engine/communicator_obs.cc.
 public:
  std::shared_ptr<obs::Recorder> recorder() const { return recorder_; }

 private:
  void attachRecorder();
  void retireRecorder();
  void recordFailure(const std::string& why);
  std::shared_ptr<obs::Recorder> recorder_;
};

}  // namespace harp
