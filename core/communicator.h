// core/communicator.h — a group of ranks and the collectives they run.
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

#include "core/base/bootstrap.h"
#include "core/base/store.h"
#include "core/cost.h"
#include "core/tuning.h"
#include "core/base/types.h"
#include "transport/transport.h"

namespace harp {

class Context;
class Communicator;
namespace obs {
class Recorder;  // core/recorder.h (issue 19)
}

struct CommOptions {
  double timeout_s = -1;       // < 0: HARP_TIMEOUT or 300 s
  std::string transport;       // "" : HARP_TRANSPORT or automatic per peer
};

struct CollOptions {
  std::string algo;            // "" : tuning table (and HARP_ALGO)
  double timeout_s = -1;       // < 0: the communicator's timeout
};

// One send or receive of a p2p_batch (NCCL's grouped ncclSend/ncclRecv). Each
// travels exactly like a single send/recv with the batch's dtype and tag, so
// it matches a plain send/recv on the peer; peer == this rank is a local copy
// paired, in order, with this rank's own receive.
struct P2pOp {
  bool send = true;
  int peer = -1;
  void* buf = nullptr;  // read for a send, written for a receive
  size_t count = 0;     // elements
};

// Everything a collective needs; counts are in elements.
struct CollArgs {
  CollType coll = CollType::kAllreduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  // allreduce/broadcast/reduce: total; allgather/gather: per rank sent;
  // reduce_scatter/scatter: per rank received; alltoall: per pair; send/recv: total.
  size_t count = 0;
  DataType dtype = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;   // rooted collectives
  int peer = -1;  // send/recv
  uint32_t tag = 0;  // send/recv user tag
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;  // alltoallv
  std::vector<P2pOp> p2p;  // p2p_batch: posted together, then waited for together
  CollOptions opts;
};

// What a running collective borrows from its communicator: the connections
// and the buffers reused across calls. The communicator owns it, fills it in
// when it connects (connectAll) and empties it in destroy(); a Context
// (core/context.h) holds a reference to it for one collective. Threading:
// touched only by the thread executing a collective (under the
// communicator's execution lock), except `transports`, which abort() also
// walks (Transport::abort is callable from any thread).
struct CommResources {
  std::vector<std::unique_ptr<transport::Transport>> transports;  // every transport in use
  std::vector<transport::Transport*> transport_of;  // by peer rank (nullptr for self)
  std::vector<transport::Pair*> pair_of;            // by peer rank (nullptr for self)
  int spin = 64;               // HARP_SPIN: progress polls before yielding, then blocking
  size_t segment_bytes = 0;    // HARP_SEGMENT_BYTES: pipelining segment
  std::vector<uint8_t> scratch;        // Context::scratch
  std::vector<Descriptor> check_buf;   // peers' descriptors (Context::startCheck)
  // Observability (issue 19): the flight recorder (nullptr: HARP_FR_ENTRIES=0)
  // and HARP_STALL_WARNING_S, read once; Context::waitAll's stall check.
  obs::Recorder* recorder = nullptr;
  double stall_warning_s = 60;
};

class Work {
 public:
  // Waits for completion (timeout_s < 0: forever; the collective itself has a
  // timeout). Throws the collective's error. Returns false on timeout.
  bool wait(double timeout_s = -1);
  bool test();  // true when finished (successfully or not); never throws
  bool failed();
  std::string error();

 private:
  friend class Communicator;
  void finish(std::exception_ptr e);
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> on_done_;
};

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Collective: every rank calls with the same store (prefix) and size.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              CommOptions opts = {});
  static std::shared_ptr<Communicator> create(const UniqueId& id, int rank, int size,
                                              CommOptions opts = {});
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout() const { return timeout_s_; }
  // Name of the transport used for `peer` ("self" for this rank).
  std::string transportName(int peer) const;
  // Validate, then run now (async=false, idle communicator) or queue.
  std::shared_ptr<Work> submit(CollArgs args, bool async);
  // Blocking submit without a Work object: errors are thrown from here. The
  // per-call path of the bindings (no allocation, no condition variable).
  void run(CollArgs args);

  // Convenience wrappers (blocking unless async).
  std::shared_ptr<Work> allreduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                                  CollOptions o = {}, bool async = false);
  std::shared_ptr<Work> broadcast(void* buf, size_t count, DataType dt, int root, CollOptions o = {},
                                  bool async = false);
  std::shared_ptr<Work> barrier(bool async = false);

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, old rank). color < 0: this rank gets nullptr.
  std::shared_ptr<Communicator> split(int color, int key);

  // Break the communicator on every rank (best effort) and fail pending work.
  void abort(const std::string& reason);
  // Wait for queued work, tell peers goodbye, release everything. Idempotent.
  void destroy();
  bool broken() const { return broken_.load(); }
  std::string brokenReason();

  // Algorithm that would run (core/select.h: user, tuning table, cost model,
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
  void execute(CollArgs& a, Work& w);
  void runCollective(CollArgs& a);
  void runWith(CollArgs& a, DataType user_dtype);
  void runIntAvg(CollArgs& a);
  void closingCheck(const CollArgs& a, uint32_t seq);
  void validate(const CollArgs& a) const;
  void checkBuffers(const CollArgs& a) const;
  void workerLoop();
  void markBroken(const std::string& why);
  std::shared_ptr<Communicator> splitCreate(const std::vector<int64_t>& all, int color, int seq);

  std::shared_ptr<Store> store_;
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
    const struct Algorithm* algo = nullptr;  // nullptr: nothing memoised yet
  };
  AlgoMemo algo_memo_[32];
  const struct Algorithm* algorithmFor(const CollArgs& a);

  // Observability (issue 19): flight recorder, op counters and metrics
  // (core/recorder.h); made by attachRecorder() when creation succeeded,
  // retired by destroy(). core/communicator_obs.cc.
 public:
  std::shared_ptr<obs::Recorder> recorder() const { return recorder_; }

 private:
  void attachRecorder();
  void retireRecorder();
  void recordFailure(const std::string& why);
  std::shared_ptr<obs::Recorder> recorder_;
};

}  // namespace harp
