// Tuning table parsing and lookup, HARP_ALGO syntax, tags, block partition.
#include <gtest/gtest.h>

#include "core/context.h"
#include "core/tuning.h"

using namespace harp;

TEST(Tuning, ParsesRowsAndMatchesFirst) {
  auto rows = parseTuning(
      "# comment\n"
      "allreduce tcp 2-4 0-1K a\n"
      "allreduce *   *   1K-  b\n"
      "broadcast *   *   *    c\n",
      "test");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].min_ranks, 2);
  EXPECT_EQ(rows[0].max_ranks, 4);
  EXPECT_EQ(rows[0].max_bytes, 1024u);
  EXPECT_EQ(rows[1].min_bytes, 1024u);
  EXPECT_EQ(rows[1].max_bytes, SIZE_MAX);
}

TEST(Tuning, RejectsBadRows) {
  EXPECT_THROW(parseTuning("allreduce tcp 2-4 0-1K\n", "t"), Error);
  EXPECT_THROW(parseTuning("allsum * * * ring\n", "t"), Error);
  EXPECT_THROW(parseTuning("allreduce * * 1Q ring\n", "t"), Error);
}

TEST(Tuning, AlgoOverrideSyntax) {
  auto r = parseAlgoOverride("ring");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].coll, CollType::kAllreduce);
  r = parseAlgoOverride("allreduce:0-64K:recursive_doubling,broadcast:binomial");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].max_bytes, 65536u);
  EXPECT_EQ(r[1].coll, CollType::kBroadcast);
  EXPECT_THROW(parseAlgoOverride("a:b:c:d"), Error);
}

TEST(Tuning, BuiltinTableCoversEveryCollective) {
  TuningTable t = TuningTable::fromEnvironment();
  for (int c = 0; c < kNumCollTypes; ++c)
    for (int p : {1, 2, 3, 8, 64})
      for (size_t b : {0ul, 8ul, 100000ul, 1ul << 30})
        EXPECT_FALSE(t.lookup(static_cast<CollType>(c), "tcp", p, b).empty()) << collName(static_cast<CollType>(c));
}

TEST(Tag, RoundTripsTheDescriptor) {
  uint64_t t = makeTag(4097, CollType::kReduce, DataType::kBfloat16, ReduceOp::kMax, 3, 123456);
  std::string d = describeTag(t);
  EXPECT_NE(d.find("reduce(count=123456, dtype=bfloat16, op=max, root=3)"), std::string::npos) << d;
  EXPECT_NE(makeTag(1, CollType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 0, 10),
            makeTag(1, CollType::kAllreduce, DataType::kInt32, ReduceOp::kSum, 0, 10));
}

TEST(Blocks, PartitionIsExactForAnyCount) {
  for (size_t count : {0ul, 1ul, 5ul, 7ul, 1000ul, 1001ul})
    for (size_t n : {1ul, 2ul, 3ul, 7ul, 8ul}) {
      Blocks b{count, n};
      size_t total = 0;
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(b.offset(i), total);
        total += b.size(i);
        EXPECT_LE(b.size(0) - b.size(i), 1u);
      }
      EXPECT_EQ(total, count);
      EXPECT_EQ(b.offset(n), count);
    }
}
