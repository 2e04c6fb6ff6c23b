// core/engine/executor.cc — where a call runs: on the calling thread when the
// communicator is idle and the call blocks, otherwise queued for the worker
// thread; the Work handle an async call returns; the guard against two
// threads inside one communicator at once (core/engine/communicator.h, Threading).
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "base/env.h"
#include "core/engine/communicator.h"

namespace harp {

// ---------------------------------------------------------------------------
// Work

bool Work::wait(double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  if (timeout_s < 0) {
    cv_.wait(l, [&] { return done_; });
  } else if (!cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::test() {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

bool Work::failed() {
  std::lock_guard<std::mutex> l(mu_);
  return done_ && error_;
}

std::string Work::error() {
  std::lock_guard<std::mutex> l(mu_);
  if (!error_) return "";
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    return e.what();
  }
}

void Work::finish(std::exception_ptr e) {
  std::function<void()> cb;
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    error_ = e;
    cb = std::move(on_done_);
  }
  cv_.notify_all();
  if (cb) cb();
}

// ---------------------------------------------------------------------------
// Submission and the worker

// Calls on one communicator must not overlap: ranks pair collectives by call
// order, which two threads racing on one communicator make differ between
// ranks (wrong data with no error). owner_ holds the OS thread id of the
// thread inside submit()/run() (0: none); one compare-exchange and one store
// per call. An overlapping call from another thread breaks the communicator
// (on every rank: the pairing can no longer be trusted) and raises
// InvalidArgumentError naming both threads. Sequential calls from different
// threads are fine; the worker thread never enters here.
namespace {
uint64_t thisThreadId() {
  static thread_local const uint64_t id = static_cast<uint64_t>(::syscall(SYS_gettid));
  return id;
}
}  // namespace

class Communicator::CallGuard {
 public:
  CallGuard(Communicator& c, const CollArgs& a) : c_(c) {
    // First: a forked child's copy may see a parent thread's owner word, and must not break anything.
    if (inheritedAcrossFork(c_.made_in_)) [[unlikely]]
      c_.refuseInherited(collName(a.coll));
    const uint64_t me = thisThreadId();
    uint64_t cur = 0;
    if (c_.owner_.compare_exchange_strong(cur, me, std::memory_order_acquire)) return;
    if (cur == me) {  // nested call on this thread (split's own collectives)
      nested_ = true;
      return;
    }
    std::string why = std::string(collName(a.coll)) + " called on thread " + std::to_string(me) +
                      " while thread " + std::to_string(cur) +
                      " is inside a call on the same communicator: calls on one communicator must not overlap "
                      "(see README, Threading); the communicator is now broken on every rank";
    c_.markBroken("concurrent use: " + why);
    throw InvalidArgument(why);
  }
  ~CallGuard() {
    if (!nested_) c_.owner_.store(0, std::memory_order_release);
  }

 private:
  Communicator& c_;
  bool nested_ = false;
};

std::shared_ptr<Work> Communicator::submit(CollArgs args, bool async) {
  CallGuard guard(*this, args);
  if (destroyed_) throw InvalidArgument("communicator has been destroyed");
  validate(args);
  if (broken_.load()) {
    std::lock_guard<std::mutex> g(broken_mu_);
    throw Error(broken_kind_, broken_reason_);
  }
  auto w = std::make_shared<Work>();
  if (!async) {
    std::unique_lock<std::mutex> ql(q_mu_);
    if (in_flight_ == 0) {
      ql.unlock();
      std::lock_guard<std::mutex> ex(exec_mu_);
      execute(args, *w);
      w->wait();
      return w;
    }
  }
  {
    std::lock_guard<std::mutex> ql(q_mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] {
      env::nameThread("harp-worker");
      workerLoop();
    });
    queue_.emplace_back(std::move(args), w);
    ++in_flight_;
  }
  q_cv_.notify_one();
  if (!async) w->wait();
  return w;
}

namespace {
// run()'s rare path, out of line so that the per-call path keeps a small frame
// (inlined, the CollArgs move cost run() 5 instructions a call, callgrind).
[[gnu::noinline, gnu::cold]] void submitBehindQueue(Communicator& c, CollArgs& args) { c.submit(std::move(args), false); }
}  // namespace

void Communicator::run(CollArgs args) {
  CallGuard guard(*this, args);
  {
    std::unique_lock<std::mutex> ql(q_mu_);
    if (in_flight_ != 0 || destroyed_) {  // behind queued work: wait like submit() does
      ql.unlock();
      submitBehindQueue(*this, args);
      return;
    }
  }
  validate(args);
  std::lock_guard<std::mutex> ex(exec_mu_);
  runCollective(args);
}

void Communicator::workerLoop() {
  for (;;) {
    std::pair<CollArgs, std::shared_ptr<Work>> item;
    {
      std::unique_lock<std::mutex> l(q_mu_);
      q_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    {
      std::lock_guard<std::mutex> ex(exec_mu_);
      execute(item.first, *item.second);
    }
    {
      std::lock_guard<std::mutex> l(q_mu_);
      --in_flight_;
    }
  }
}

void Communicator::execute(CollArgs& a, Work& w) {
  try {
    runCollective(a);
    w.finish(nullptr);
  } catch (...) {
    w.finish(std::current_exception());
  }
}

}  // namespace harp
