// bench/recorder_cost.cc — what the flight recorder's per-call hook costs, in C++.
//
// Build: g++ -std=c++20 -O2 -I. bench/recorder_cost.cc -Lbuild/dev -lharp -Wl,-rpath,$PWD/build/dev -o /tmp/reccost
// Run:   HARP_TRANSPORT=shm /tmp/reccost [ranks=2] [rounds=20000] [iters=20]
//
// Two figures:
//   hook:      one obs::OpScope (begin + ok) per iteration on a standalone Recorder of 2000
//              slots, in a tight loop (the ring wraps; nothing else runs; the caches stay warm):
//              thread-CPU nanoseconds per call, and the same loop without a recorder.
//   allreduce: `ranks` forked ranks, one communicator, 8-byte float32 allreduce through
//              Communicator::allreduce (no Python); the recorder is paused and resumed
//              (Recorder::setPaused) in alternating short rounds of `iters` calls (on, off, off,
//              on, ...) so machine noise hits both alike. Rank 0 prints the median per-call time
//              of each, their ratio and difference, and the on/off ratio of medians in each of 10
//              consecutive blocks of rounds (min, median, max).
// Every rank checks its allreduce result ({1, 2} summed over the ranks) and exits 1 if it is wrong.
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/algorithms/algorithm.h"
#include "core/engine/communicator.h"
#include "core/observe/recorder.h"

using namespace harp;
using Clock = std::chrono::steady_clock;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

static double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>(q * (v.size() - 1))];
}

static double threadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// ns per call of the hook alone (recorder != nullptr) or of the null check (nullptr), in this
// thread's CPU time (a loaded machine's preemption left out).
static double hookNs(obs::Recorder* rec, const Algorithm* algo, int iters) {
  CollArgs a;
  a.coll = CollType::kAllreduce;
  a.count = 2;
  a.dtype = DataType::kFloat32;
  const double t0 = threadCpuNs();
  for (int i = 0; i < iters; ++i) {
    obs::OpScope s(rec, a, algo, DataType::kFloat32, static_cast<uint32_t>(i + 1));
    asm volatile("" ::: "memory");  // the collective would run here
    s.ok();
  }
  return (threadCpuNs() - t0) / iters;
}

static int rankMain(const UniqueId& id, int r, int n, int rounds, int iters) {
  auto c = Communicator::create(id, r, n);
  auto rec = c->recorder();
  if (!rec) {
    fprintf(stderr, "rank %d: no recorder (HARP_FR_ENTRIES=0?)\n", r);
    return 2;
  }
  float x[2] = {1.0f, 2.0f}, y[2] = {0, 0};
  for (int i = 0; i < 2000; ++i) c->allreduce(x, y, 2, DataType::kFloat32, ReduceOp::kSum);
  std::vector<double> on, off;
  for (int k = 0; k < 2 * rounds; ++k) {
    const bool rec_on = (k % 4 == 0 || k % 4 == 3);  // on, off, off, on, ...
    rec->setPaused(!rec_on);
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) c->allreduce(x, y, 2, DataType::kFloat32, ReduceOp::kSum);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
    (rec_on ? on : off).push_back(us);
  }
  rec->setPaused(false);
  c->destroy();
  if (y[0] != 1.0f * n || y[1] != 2.0f * n) {
    fprintf(stderr, "rank %d: wrong sum %g %g\n", r, y[0], y[1]);
    return 1;
  }
  if (r == 0) {
    std::vector<double> blocks;
    const size_t b = on.size() / 10;
    for (size_t i = 0; b && i < 10; ++i)
      blocks.push_back(median({on.begin() + i * b, on.begin() + (i + 1) * b}) /
                       median({off.begin() + i * b, off.begin() + (i + 1) * b}));
    printf("allreduce 8 B, %d ranks, %s, %d rounds x %d calls each: recorder on %.4f us, off %.4f us (medians), "
           "on/off %.4f, on-off %.1f ns; 10 blocks' on/off min %.4f median %.4f max %.4f\n",
           n, getenv("HARP_TRANSPORT") ? getenv("HARP_TRANSPORT") : "auto", rounds, iters, median(on), median(off),
           median(on) / median(off), (median(on) - median(off)) * 1e3, *std::min_element(blocks.begin(), blocks.end()),
           median(blocks), *std::max_element(blocks.begin(), blocks.end()));
  }
  return 0;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  int rounds = argc > 2 ? atoi(argv[2]) : 20000;
  int iters = argc > 3 ? atoi(argv[3]) : 20;
  const Algorithm* algo = algorithmsOf(CollType::kAllreduce).at(0);
  {
    obs::Identity id;
    id.size = 1;
    obs::Recorder rec(id, 2000, nullptr);
    std::vector<double> with, without;
    for (int k = 0; k < 400; ++k) {
      with.push_back(hookNs(&rec, algo, 10000));
      without.push_back(hookNs(nullptr, algo, 10000));
    }
    printf("hook alone (2000-slot ring, tight loop, thread CPU time): %.1f ns per call (min %.1f), no recorder %.1f ns; "
           "ops recorded %llu\n", median(with), *std::min_element(with.begin(), with.end()), median(without),
           static_cast<unsigned long long>(rec.ops()));
  }
  fflush(stdout);
  UniqueId id = createUniqueId("127.0.0.1");
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      int rc = 2;
      try {
        rc = rankMain(id, r, n, rounds, iters);
      } catch (std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids.push_back(p);
  }
  int failed = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return failed;
}
