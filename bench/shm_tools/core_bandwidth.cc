// bench/shm_tools/core_bandwidth.cc — what one core can move, the floor under
// any intra-host allreduce (bench/RESULTS-shm.md, "Where the floor is").
// Build: g++ -std=c++20 -O3 -march=native bench/shm_tools/core_bandwidth.cc -lpthread -o /tmp/corebw
// Run:   /tmp/corebw [chunk bytes, default 256K] [big buffer bytes, default 16M]
// Two threads pinned to CPUs 0 and 1 hand a shared chunk back and forth, as
// the shm allreduce does with its collective buffers:
//   local copy        memcpy between two chunks this core owns (L2-resident)
//   write into shared memcpy into a chunk the other core read last round
//   read from shared  memcpy out of a chunk the other core wrote last round
//   in-place update   x += 1 over a big buffer (an in-place allreduce must at
//                     least read and write its whole buffer once)
//   CMA read          process_vm_readv of a big buffer from another process
//                     into a chunk-sized window (kernel single copy)
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <thread>

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
size_t size(const char* s) {  // 256K, 16M
  char* end;
  size_t v = strtoul(s, &end, 0);
  return v << (*end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0);
}
char* buffer(size_t n, int v) {
  char* p = static_cast<char*>(aligned_alloc(4096, (n + 4095) / 4096 * 4096));
  memset(p, v, n);
  return p;
}
}  // namespace

int main(int argc, char** argv) {
  const size_t S = argc > 1 ? size(argv[1]) : 256 << 10;
  const size_t B = argc > 2 ? size(argv[2]) : 16 << 20;
  const int R = 2000;
  char *shared = buffer(S, 1), *src = buffer(S, 2), *dst = buffer(S, 3);

  pin(0);
  double t = now();
  for (int i = 0; i < R; ++i) memcpy(dst, src, S);
  printf("local copy         %6.1f GB/s  (%zu-byte chunks)\n", S * R / (now() - t) / 1e9, S);

  std::atomic<long> wrote{0}, got{0};
  double tw = 0, tr = 0;
  std::thread peer([&] {
    pin(1);
    for (long i = 1; i <= R; ++i) {
      while (wrote.load(std::memory_order_acquire) < i) sched_yield();
      double t0 = now();
      memcpy(dst, shared, S);
      tr += now() - t0;
      got.store(i, std::memory_order_release);
    }
  });
  for (long i = 1; i <= R; ++i) {
    while (got.load(std::memory_order_acquire) < i - 1) sched_yield();
    double t0 = now();
    memcpy(shared, src, S);
    tw += now() - t0;
    wrote.store(i, std::memory_order_release);
  }
  peer.join();
  printf("write into shared  %6.1f GB/s  (lines the other core read)\n", S * R / tw / 1e9);
  printf("read from shared   %6.1f GB/s  (lines the other core wrote)\n", S * R / tr / 1e9);

  float* big = reinterpret_cast<float*>(buffer(B, 0));
  const size_t n = B / sizeof(float);
  for (size_t i = 0; i < n; ++i) big[i] += 1;
  const int reps = static_cast<int>(std::max<size_t>(5, (1ul << 30) / B));
  t = now();
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < n; ++i) big[i] += 1;
  double dt = (now() - t) / reps;
  printf("in-place update    %6.1f GB/s  (%zu bytes read and written in %.0f us)\n", B / dt / 1e9, B, dt * 1e6);

  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {  // holds `big`, written by itself, until killed
    memset(big, 5, B);
    if (write(fds[1], "x", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c;
  if (read(fds[0], &c, 1) != 1) return 1;
  char* window = buffer(S, 0);
  t = now();
  for (int r = 0; r < 5; ++r)
    for (size_t o = 0; o < B; o += S) {
      iovec l{window, std::min(S, B - o)}, rm{reinterpret_cast<char*>(big) + o, l.iov_len};
      if (process_vm_readv(child, &l, 1, &rm, 1, 0) != static_cast<ssize_t>(l.iov_len)) {
        perror("process_vm_readv (needs ptrace permission over the child)");
        break;
      }
    }
  printf("CMA read           %6.1f GB/s  (%zu bytes in %zu-byte pieces)\n", 5.0 * B / (now() - t) / 1e9, B, S);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}
