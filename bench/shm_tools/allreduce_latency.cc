// bench/shm_tools/allreduce_latency.cc — C++ allreduce latency between forked ranks (no Python).
// Build: g++ -std=c++20 -O2 -I. bench/shm_tools/allreduce_latency.cc -Lbuild/dev -lharp -Wl,-rpath,$PWD/build/dev -o /tmp/lat
// Run:   HARP_ALGO=shm /tmp/lat <ranks> <float count> <iters>   (chrt -f 10 to take machine load out)
// Every rank checks its result after the timed loop (rank r adds r+1 in element i's
// (i % 7) multiple, so a wrong sum, order or offset shows) and exits 1 naming the first
// wrong element; the parent exits 1 if any rank failed.
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "core/engine/communicator.h"
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
      std::vector<float> x(count), y(count);
      for (size_t i = 0; i < count; ++i) x[i] = float((r + 1) * (i % 7 + 1));
      for (int i = 0; i < 100; ++i) c->allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kSum);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) c->allreduce(x.data(), y.data(), count, DataType::kFloat32, ReduceOp::kSum);
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      if (r == 0) printf("n=%d bytes=%zu %.2f us  algo=%s\n", n, count * 4, dt * 1e6,
                         c->chooseAlgorithm({CollType::kAllreduce, x.data(), y.data(), count, DataType::kFloat32}).c_str());
      c->destroy();
      size_t wrong = 0, first = 0;
      for (size_t i = 0; i < count; ++i) {
        float want = float(n * (n + 1) / 2 * (i % 7 + 1));  // sum over ranks of (q+1)(i%7+1): exact in float
        if (y[i] != want && !wrong++) first = i;
      }
      if (wrong) {
        fprintf(stderr, "rank %d: %zu wrong values; first [%zu] = %g, expected %g\n", r, wrong, first, y[first],
                double(n * (n + 1) / 2 * (first % 7 + 1)));
        fflush(stderr);
        _exit(1);
      }
      } catch (std::exception& e) { fprintf(stderr, "rank %d: %s\n", r, e.what()); _exit(2); }
      fflush(stdout); _exit(0);
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
