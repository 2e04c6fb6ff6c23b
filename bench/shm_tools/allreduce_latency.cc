// bench/shm_tools/allreduce_latency.cc — C++ allreduce latency between forked ranks (no Python).
// Build: g++ -std=c++20 -O2 -I. bench/shm_tools/allreduce_latency.cc -Lbuild/dev -lharp -Wl,-rpath,$PWD/build/dev -o /tmp/lat
// Run:   HARP_ALGO=shm /tmp/lat <ranks> <float count> <iters>   (chrt -f 10 to take machine load out)
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "core/communicator.h"
using namespace harp;
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  size_t count = argc > 2 ? atol(argv[2]) : 2;
  int iters = argc > 3 ? atoi(argv[3]) : 5000;
  UniqueId id = createUniqueId("127.0.0.1");
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      try {
      auto c = Communicator::create(id, r, n);
      std::vector<float> x(count, 1.0f), y(count);
      for (int i = 0; i < 100; ++i) c->allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kSum);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) c->allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kSum);
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      if (r == 0) printf("n=%d bytes=%zu %.2f us  algo=%s\n", n, count * 4, dt * 1e6,
                         c->chooseAlgorithm({CollType::kAllreduce, x.data(), y.data(), count, DataType::kFloat32}).c_str());
      c->destroy();
      } catch (std::exception& e) { fprintf(stderr, "rank %d: %s\n", r, e.what()); }
      fflush(stdout); _exit(0);
    }
    pids.push_back(p);
  }
  for (pid_t p : pids) waitpid(p, nullptr, 0);
}
