// tests/cpp/test_public_api.cc — the public C++ API (include/harp/harp.h) used
// the way a program outside the tree uses it: this file includes only
// <harp/harp.h> and the standard library, and tests/test_public_api.py builds
// it with nothing but include/ on the include path, against libharp.so.
//
// Three forked ranks: rank 0 creates the unique id and hands it to the others
// through a pipe (so the parent stays single-threaded when it forks). Each rank
// checks allreduce, broadcast, allgather, reduce_scatter, alltoall, gather,
// scatter, send/recv, an async call, split, and the error paths (a bad root
// names the argument and leaves the communicator usable; an empty handle
// refuses calls), then prints "rank R ok". Exit status 0 only if every rank
// passed; a rank that hangs is killed after 120 s.
#include <harp/harp.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace hp = harp::api;

namespace {

constexpr int kRanks = 3;
int failures = 0;

#define EXPECT(cond, ...)                                         \
  do {                                                            \
    if (!(cond)) {                                                \
      std::fprintf(stderr, "rank %d: %s:%d: %s: ", rank, __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                          \
      std::fprintf(stderr, "\n");                                 \
      ++failures;                                                 \
    }                                                             \
  } while (0)

// Expects f to throw hp::Error of `kind` whose message contains `needle`.
template <class F>
void expectError(int rank, F&& f, hp::ErrorKind kind, const char* needle, const char* what) {
  try {
    f();
    EXPECT(false, "%s: no error", what);
  } catch (const hp::Error& e) {
    EXPECT(e.kind() == kind, "%s: kind %d, want %d (%s)", what, static_cast<int>(e.kind()), static_cast<int>(kind),
           e.what());
    EXPECT(std::strstr(e.what(), needle) != nullptr, "%s: message '%s' lacks '%s'", what, e.what(), needle);
  }
}

void runRank(int rank, int id_in, const std::vector<int>& id_out) {
  hp::UniqueId id;
  if (rank == 0) {
    id = hp::UniqueId::create();
    const std::string hex = id.hex();
    for (int fd : id_out)
      if (write(fd, hex.data(), hex.size()) != static_cast<ssize_t>(hex.size())) std::exit(3);
  } else {
    std::string hex(256, '\0');
    size_t got = 0;
    while (got < hex.size()) {
      ssize_t n = read(id_in, &hex[got], hex.size() - got);
      if (n <= 0) std::exit(3);
      got += static_cast<size_t>(n);
    }
    id = hp::UniqueId::fromHex(hex);
  }
  hp::CommOptions opts;
  opts.timeout_s = 60;
  hp::Comm comm = hp::Comm::create(id, rank, kRanks, opts);
  EXPECT(comm && comm.rank() == rank && comm.size() == kRanks, "rank %d size %d", comm.rank(), comm.size());
  const int p = kRanks;
  const size_t n = 1000;

  // allreduce: sum of rank + 1 over every rank, and max of int64.
  std::vector<float> x(n, static_cast<float>(rank + 1)), y(n, -1);
  comm.allreduce(x.data(), y.data(), n, hp::DataType::kFloat32, hp::ReduceOp::kSum);
  for (size_t i = 0; i < n; ++i) EXPECT(y[i] == 6.0f, "allreduce y[%zu] = %g", i, y[i]);
  std::vector<int64_t> m(n);
  for (size_t i = 0; i < n; ++i) m[i] = static_cast<int64_t>(i) * (rank == 1 ? 3 : 1) - rank;
  comm.allreduce(m.data(), m.data(), n, hp::DataType::kInt64, hp::ReduceOp::kMax);  // in place
  for (size_t i = 0; i < n; ++i) {
    const int64_t ii = static_cast<int64_t>(i);
    EXPECT(m[i] == std::max<int64_t>(3 * ii - 1, ii), "allreduce max m[%zu] = %lld", i, (long long)m[i]);
  }

  // broadcast from rank 2.
  std::vector<int32_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = rank == 2 ? static_cast<int32_t>(7 * i + 1) : -1;
  comm.broadcast(b.data(), n, hp::DataType::kInt32, 2);
  for (size_t i = 0; i < n; ++i) EXPECT(b[i] == static_cast<int32_t>(7 * i + 1), "broadcast b[%zu] = %d", i, b[i]);

  // allgather: rank r's block holds r * 100 + i.
  std::vector<double> mine(n), all(n * p, -1);
  for (size_t i = 0; i < n; ++i) mine[i] = rank * 100.0 + i;
  comm.allgather(mine.data(), all.data(), n, hp::DataType::kFloat64);
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < n; ++i)
      EXPECT(all[r * n + i] == r * 100.0 + i, "allgather all[%d][%zu] = %g", r, i, all[r * n + i]);

  // reduce_scatter: every rank sends block j = j + rank; block `rank` sums to p * rank + 0 + 1 + 2.
  std::vector<int32_t> rs_in(n * p), rs_out(n, -1);
  for (int j = 0; j < p; ++j)
    for (size_t i = 0; i < n; ++i) rs_in[j * n + i] = j + rank;
  comm.reduce_scatter(rs_in.data(), rs_out.data(), n, hp::DataType::kInt32, hp::ReduceOp::kSum);
  for (size_t i = 0; i < n; ++i) EXPECT(rs_out[i] == p * rank + 3, "reduce_scatter out[%zu] = %d", i, rs_out[i]);

  // alltoall: block j of rank r's send is r * 10 + j; rank r receives j * 10 + r from rank j.
  std::vector<int32_t> a_in(p), a_out(p, -1);
  for (int j = 0; j < p; ++j) a_in[j] = rank * 10 + j;
  comm.alltoall(a_in.data(), a_out.data(), 1, hp::DataType::kInt32);
  for (int j = 0; j < p; ++j) EXPECT(a_out[j] == j * 10 + rank, "alltoall out[%d] = %d", j, a_out[j]);

  // gather to rank 1, scatter from rank 0.
  int32_t g = rank * rank;
  std::vector<int32_t> gathered(p, -1);
  comm.gather(&g, rank == 1 ? gathered.data() : nullptr, 1, hp::DataType::kInt32, 1);
  if (rank == 1)
    for (int j = 0; j < p; ++j) EXPECT(gathered[j] == j * j, "gather [%d] = %d", j, gathered[j]);
  std::vector<int32_t> parts{11, 22, 33};
  int32_t part = -1;
  comm.scatter(rank == 0 ? parts.data() : nullptr, &part, 1, hp::DataType::kInt32, 0);
  EXPECT(part == parts[rank], "scatter part = %d", part);

  // send/recv around the ring, async sends so no rank blocks the next.
  int32_t out = 1000 + rank, in = -1;
  hp::CallOptions async;
  async.async = true;
  hp::Work sent = comm.send(&out, 1, hp::DataType::kInt32, (rank + 1) % p, 5, async);
  comm.recv(&in, 1, hp::DataType::kInt32, (rank + p - 1) % p, 5);
  EXPECT(sent.wait(60), "send did not finish");
  EXPECT(in == 1000 + (rank + p - 1) % p, "recv got %d", in);

  // async allreduce: the Work reports the end.
  std::vector<uint8_t> u(n, static_cast<uint8_t>(rank + 1));
  hp::Work w = comm.allreduce(u.data(), u.data(), n, hp::DataType::kUint8, hp::ReduceOp::kProd, async);
  EXPECT(w.wait(60), "async allreduce did not finish in 60 s");
  EXPECT(w.test() && !w.failed() && w.error().empty(), "async allreduce: failed %d error '%s'", w.failed(),
         w.error().c_str());
  for (size_t i = 0; i < n; ++i) EXPECT(u[i] == 6, "async allreduce u[%zu] = %d", i, u[i]);

  // Error paths: a bad root names the argument and leaves the communicator usable.
  expectError(rank, [&] { comm.broadcast(b.data(), n, hp::DataType::kInt32, 7); }, hp::ErrorKind::kInvalidArgument,
              "root 7 is out of range", "broadcast with root 7");
  expectError(rank, [&] { comm.allreduce(x.data(), nullptr, n, hp::DataType::kFloat32, hp::ReduceOp::kSum); },
              hp::ErrorKind::kInvalidArgument, "receive buffer is null", "allreduce without a receive buffer");
  expectError(rank, [&] { comm.allreduce(x.data(), y.data(), n, hp::DataType::kFloat32, hp::ReduceOp::kBxor); },
              hp::ErrorKind::kInvalidArgument, "bxor", "bxor of float32");
  comm.barrier();  // still usable
  comm.allreduce(x.data(), y.data(), n, hp::DataType::kFloat32, hp::ReduceOp::kSum);
  EXPECT(y[0] == 6.0f, "allreduce after the refused calls: %g", y[0]);

  // split: ranks 0 and 2 (color 0) form a two-rank communicator, rank 1 none.
  hp::Comm sub = comm.split(rank == 1 ? -1 : 0, -rank);
  if (rank == 1) {
    EXPECT(!sub, "rank 1 should be left out of the split");
    expectError(rank, [&] { sub.barrier(); }, hp::ErrorKind::kInvalidArgument, "empty handle", "a call on an empty Comm");
  } else {
    EXPECT(sub && sub.size() == 2 && sub.rank() == (rank == 2 ? 0 : 1), "split: rank %d of %d", sub.rank(), sub.size());
    int32_t v = rank, s = -1;
    sub.allreduce(&v, &s, 1, hp::DataType::kInt32, hp::ReduceOp::kSum);
    EXPECT(s == 2, "split allreduce = %d", s);
    sub.destroy();
    EXPECT(!sub, "a destroyed Comm is empty");
  }
  hp::Comm copy = comm;
  comm.destroy();
  EXPECT(!copy, "every handle of a destroyed communicator is empty");
  expectError(rank, [&] { copy.rank(); }, hp::ErrorKind::kInvalidArgument, "destroyed", "rank() after destroy");
}

}  // namespace

int main() {
  std::vector<int> rd(kRanks, -1), wr(kRanks, -1);
  for (int r = 1; r < kRanks; ++r) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    rd[r] = fds[0];
    wr[r] = fds[1];
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      const int rank = r;
      try {
        runRank(rank, rd[rank], rank == 0 ? std::vector<int>(wr.begin() + 1, wr.end()) : std::vector<int>{});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: unexpected exception: %s\n", rank, e.what());
        ++failures;
      }
      if (failures == 0) std::printf("rank %d ok\n", rank);
      std::fflush(stdout);
      _exit(failures == 0 ? 0 : 1);
    }
    if (pid < 0) return 2;
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int bad = 0, left = kRanks;
  while (left > 0) {
    int status = 0;
    pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++bad;
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "ranks still running after 120 s: killed\n");
      for (pid_t p : pids) kill(p, SIGKILL);
      while (waitpid(-1, &status, 0) > 0) {
      }
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf(bad == 0 ? "public API: all ranks ok\n" : "public API: %d rank(s) failed\n", bad);
  return bad == 0 ? 0 : 1;
}
