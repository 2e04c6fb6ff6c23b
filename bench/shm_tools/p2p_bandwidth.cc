// bench/shm_tools/p2p_bandwidth.cc — one-way send/recv bandwidth rank 0 -> 1 (C++).
// Build like allreduce_latency.cc; run: HARP_TRANSPORT=shm HARP_SHM_CMA=0|1 /tmp/p2p <bytes> <iters>
// one-way bandwidth rank0 -> rank1 through Communicator send/recv
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "core/engine/communicator.h"
using namespace harp;
int main(int argc, char** argv) {
  size_t bytes = atol(argv[1]);
  int iters = atoi(argv[2]);
  UniqueId id = createUniqueId("127.0.0.1");
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    if (fork() == 0) {
      auto c = Communicator::create(id, r, 2);
      std::vector<char> buf(bytes, 1);
      CollArgs a;
      a.coll = r == 0 ? CollType::kSend : CollType::kRecv;
      a.sendbuf = buf.data(); a.recvbuf = buf.data(); a.count = bytes; a.dtype = DataType::kUint8; a.peer = 1 - r;
      CollArgs ack = a; ack.count = 1; ack.coll = r == 0 ? CollType::kRecv : CollType::kSend;
      for (int i = 0; i < 3; ++i) { c->submit(a, false); }
      c->submit(ack, false);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) c->submit(a, false);
      c->submit(ack, false);
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0) printf("bytes=%zu %.2f GB/s (%.1f us/msg)\n", bytes, bytes * (double)iters / dt / 1e9, dt / iters * 1e6);
      fflush(stdout);
      c->destroy();
      _exit(0);
    }
  }
  while (wait(nullptr) > 0) {}
}
