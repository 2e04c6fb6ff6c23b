// bindings/nccl/nccl_internal.h — what sits behind an ncclComm_t.
//
// An ncclComm wraps one harp::Communicator plus what NCCL adds on top:
//  - the CUDA device it was created on, the config (blocking, netName);
//  - an engine: a worker thread that runs jobs whose buffers are CUDA device
//    memory, in the order they were enqueued, after their input copies have
//    reached pinned host memory (an event on the user's stream);
//  - error state: the asynchronous error (ncclCommGetAsyncError) and its text;
//  - PreMulSum reduction operators created on it.
//
// A Job is what one call (or one group, per communicator) runs: collectives
// in order, then at most one p2p batch, over host addresses (user host
// buffers or staging copies of device buffers).
//
// Threading: as NCCL, one thread uses a communicator at a time; the engine
// thread and CUDA's host-function thread touch only Job state (its mutex) and
// the engine queue (engine mutex). Group state is thread-local (nccl_group.cc).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/nccl/cuda_rt.h"
#include "bindings/nccl/nccl.h"
#include "base/fork.h"
#include "core/engine/communicator.h"

namespace harp::nccl {

constexpr uint64_t kCommMagic = 0x4841525043434c31ull;  // "HARPCCL1"

// A PreMulSum operator: sum(scalar * x). The scalar is copied at creation
// (host-immediate) or read at run time from `ptr` (device residence).
struct RedOpEntry {
  bool live = false;
  ncclDataType_t dtype = ncclFloat32;
  bool immediate = true;
  const void* ptr = nullptr;
  unsigned char value[8] = {};
};

// Input scaling for PreMulSum: dst[i] = scalar * src[i].
struct Prescale {
  const void* src;
  void* dst;
  size_t count;
  ncclDataType_t dtype;
  RedOpEntry op;
};

// One pinned host buffer standing in for a device buffer.
struct Staging {
  void* dev = nullptr;
  void* host = nullptr;
  size_t bytes = 0;
  size_t cap = 0;
  bool copy_in = false, copy_out = false;
};

struct ncclCommImpl;

struct Job {
  ncclCommImpl* comm = nullptr;
  std::vector<CollArgs> colls;
  std::vector<Prescale> prescale;
  std::vector<std::unique_ptr<char[]>> temps;  // prescaled inputs
  // Device path only.
  cuda::Stream stream = nullptr;
  cuda::Event ready = nullptr;  // recorded after the input copies
  std::vector<Staging> staging;
  // Completion.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  ncclResult_t result = ncclSuccess;
  std::string error;
  void finish(ncclResult_t r, const std::string& e);
  void waitDone();
};

// Runs jobs in order on a worker thread (started on first use).
class Engine {
 public:
  explicit Engine(ncclCommImpl* c) : comm_(c) {}
  ~Engine();
  void enqueue(std::shared_ptr<Job> j);
  // Block until every enqueued job has run.
  void drain();
  void stop();

 private:
  void loop();
  ncclCommImpl* comm_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<Job>> q_;
  bool running_ = false, stop_ = false;
  std::thread th_;
};

struct ncclCommImpl {
  uint64_t magic = kCommMagic;
  uint64_t made_in = forkGeneration();  // base/fork.h: a forked child's copy is neither used nor torn down
  std::shared_ptr<Communicator> comm;
  int rank = 0, nranks = 0, cuda_dev = 0;
  bool blocking = true;
  std::string net_name;
  double timeout_s = -1;

  // Initialization (nonblocking config or inside a group): kInProgress until done.
  std::atomic<int> init_state{ncclSuccess};
  std::thread init_thread;

  std::mutex err_mu;
  std::atomic<int> async_error{ncclSuccess};
  std::string error_text;

  Engine engine{this};
  std::vector<RedOpEntry> redops;

  // Pinned staging buffers and events, reused (device path).
  std::mutex pool_mu;
  std::multimap<size_t, void*> free_pinned;
  std::vector<void*> all_pinned;
  std::vector<cuda::Event> free_events, all_events;
  std::atomic<int> outstanding{0};  // device jobs whose stream work has not finished
  std::atomic<int> active{0};       // API calls running on this communicator

  void setAsyncError(ncclResult_t r, const std::string& text);
  void* acquirePinned(size_t bytes, size_t* cap);
  void releasePinned(void* p, size_t cap);
  cuda::Event acquireEvent();
  void releaseEvent(cuda::Event e);
  void freePools();
};

// Helpers shared by the API files.
ncclCommImpl* impl(ncclComm_t c);  // nullptr unless a live HARP communicator
ncclResult_t resultOf(const std::exception& e);
ncclResult_t fail(ncclResult_t r, const std::string& text);  // sets the thread's last error
ncclResult_t failFrom(const std::exception& e);
void setLastError(const std::string& text);
const std::string& lastError();
DataType toDtype(ncclDataType_t d);  // throws InvalidArgument
size_t ncclTypeSize(ncclDataType_t d);
void served();  // counts calls into the library (harpNcclCallsServed)
void banner();  // HARP_DEBUG/NCCL_DEBUG=INFO: once per process
void scaleCopy(void* dst, const void* src, size_t count, ncclDataType_t dt, const void* scalar);

// Run a job now (host path, calling thread) — engine drained first.
void runJob(Job& j);

}  // namespace harp::nccl

// The public handle type is an alias of the implementation.
struct ncclComm : harp::nccl::ncclCommImpl {};

namespace harp::nccl {

// Group state (nccl_coll.cc), per thread.
bool inGroup();
// Run `fn` at the outermost ncclGroupEnd, concurrently with the other deferred
// calls of the group (communicator creation and split from one thread).
void deferToGroupEnd(std::function<int()> fn);  // fn returns an ncclResult_t
// Wait for a communicator's deferred/nonblocking creation; its result.
ncclResult_t ensureReady(ncclCommImpl* c);
// ncclInvalidUsage naming `fn` and the fork when `c` was made in a process this one was forked
// from (base/fork.h): its engine thread is the parent's, so a queued call would never run.
ncclResult_t refuseInherited(ncclCommImpl* c, const char* fn);
// Fault tolerance: create `c` (owned from here) with `make`, now, in
// the group or in the background, after reading `cfg` (nccl_init.cc). fresh:
// a communicator not derived from a parent (takes the current CUDA device).
ncclResult_t createDerived(ncclComm_t* out, ncclComm* c, std::function<std::shared_ptr<Communicator>()> make,
                           const ncclConfig_t* cfg, const char* fn, bool fresh);


}  // namespace harp::nccl
