// Communicators of several ranks inside one process (one thread per rank),
// over the real TCP transport: the C++ API without Python.
#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "core/engine/communicator.h"

using namespace harp;

namespace {
template <class F>
void runRanks(int n, F body) {
  UniqueId id = createUniqueId("127.0.0.1:0");
  std::vector<std::thread> ts;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        CommOptions o;
        o.timeout_s = 30;
        o.transport = "tcp";
        auto c = Communicator::create(id, r, n, o);
        body(*c);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}
}  // namespace

TEST(CommThreads, AllreduceEveryAlgorithm) {
  runRanks(3, [](Communicator& c) {
    for (const char* algo : {"ring", "halving_doubling", "recursive_doubling"}) {
      std::vector<double> x(1001), y(1001);
      std::iota(x.begin(), x.end(), c.rank());
      CollOptions o;
      o.algo = algo;
      c.allreduce(x.data(), y.data(), x.size(), DataType::kFloat64, ReduceOp::kSum, o);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], 3.0 * i + 3) << algo;
    }
  });
}

TEST(CommThreads, AsyncWorkCompletesInOrder) {
  runRanks(2, [](Communicator& c) {
    std::vector<std::vector<int32_t>> bufs(5, std::vector<int32_t>(100000, c.rank() + 1));
    std::vector<std::shared_ptr<Work>> ws;
    for (auto& b : bufs) ws.push_back(c.allreduce(b.data(), b.data(), b.size(), DataType::kInt32, ReduceOp::kSum, {}, true));
    ws.back()->wait();
    for (auto& w : ws) EXPECT_TRUE(w->test());
    for (auto& b : bufs) ASSERT_EQ(b[777], 3);
  });
}

TEST(CommThreads, MismatchRaisedOnBothRanks) {
  UniqueId id = createUniqueId("127.0.0.1:0");
  std::vector<int> kinds(2, -1);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      CommOptions o;
      o.timeout_s = 20;
      o.transport = "tcp";
      auto c = Communicator::create(id, r, 2, o);
      std::vector<float> x(r == 0 ? 10 : 20, 1.0f);
      try {
        c->allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
      } catch (const Error& e) {
        kinds[r] = e.kind();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(kinds[0], Error::kMismatch);
  EXPECT_EQ(kinds[1], Error::kMismatch);
}
