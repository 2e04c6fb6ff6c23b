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
  // Every field lands in its own bits: changing any one changes the tag.
  const uint64_t base = makeTag(5, CollType::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 7, 99, 1);
  EXPECT_NE(base, makeTag(6, CollType::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 7, 99, 1));
  EXPECT_NE(base, makeTag(5, CollType::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 7, 99, 2));
  EXPECT_NE(base, makeTag(5, CollType::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 8, 99, 1));
  EXPECT_NE(base, makeTag(5, CollType::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 7, 100, 1));
  EXPECT_NE(base, makeTag(5, CollType::kBroadcast, DataType::kFloat32, ReduceOp::kMax, 7, 99, 1));
  EXPECT_NE(base, makeTag(5, CollType::kBroadcast, DataType::kInt32, ReduceOp::kSum, 7, 99, 1));
  EXPECT_NE(base, makeTag(5, CollType::kGather, DataType::kFloat32, ReduceOp::kSum, 7, 99, 1));
  // No field spills into another: all-ones in one field leaves the others readable.
  std::string full = describeTag(makeTag(63, CollType::kReduce, DataType::kFloat32, ReduceOp::kMax, 4095, 0xffffffffull, 3));
  EXPECT_NE(full.find("reduce(count=4294967295, dtype=float32, op=max, root=4095) #63 algorithm #3"), std::string::npos) << full;
  EXPECT_TRUE(tagIsExact(4095, (1ull << 32) - 1));
  EXPECT_FALSE(tagIsExact(4096, 1));
  EXPECT_FALSE(tagIsExact(0, 1ull << 32));
}

TEST(Tag, P2pTagCarriesTheWhole32BitUserTag) {
  for (uint32_t t : {0u, 5u, 261u, 0x10005u, 0xffffffffu})
    for (uint32_t u : {0u, 5u, 261u, 0x10005u, 0xffffffffu})
      EXPECT_EQ(makeP2pTag(DataType::kFloat32, t) == makeP2pTag(DataType::kFloat32, u), t == u) << t << " " << u;
  EXPECT_NE(makeP2pTag(DataType::kFloat32, 5), makeP2pTag(DataType::kInt32, 5));
  EXPECT_NE(describeTag(makeP2pTag(DataType::kFloat32, 261)).find("tag=261"), std::string::npos);
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
