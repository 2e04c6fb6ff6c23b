// tests/cpp/test_store.cc — the store's request parser, timeouts that saturate,
// and HARP_TIMEOUT parsing (security). Live-server tests: tests/test_security_bootstrap.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "base/env.h"
#include "bootstrap/socket.h"
#include "bootstrap/store.h"
#include "base/types.h"

using namespace harp;
using namespace harp::store_wire;

namespace {
std::string header(uint8_t cmd, uint32_t klen) {
  std::string s(1, static_cast<char>(cmd));
  s.append(reinterpret_cast<const char*>(&klen), 4);
  return s;
}
}  // namespace

TEST(StoreWire, RoundTrip) {
  std::string m = encode(kSet, "key", "value");
  uint8_t cmd;
  std::string k, v;
  EXPECT_EQ(parse(m, &cmd, &k, &v), static_cast<long>(m.size()));
  EXPECT_EQ(cmd, kSet);
  EXPECT_EQ(k, "key");
  EXPECT_EQ(v, "value");
  for (size_t cut = 0; cut < m.size(); ++cut) EXPECT_EQ(parse(m.substr(0, cut), &cmd, &k, &v), 0) << cut;
}

TEST(StoreWire, WrappingAndOversizedLengthsAreMalformed) {
  uint8_t cmd;
  std::string k, v;
  // The original finding: 5 + klen + 4 wrapped in 32 bits for klen = 0xFFFFFFF7.
  for (uint32_t klen : {0xFFFFFFF7u, 0xFFFFFFFFu, static_cast<uint32_t>(kMaxKeyBytes + 1)})
    EXPECT_LT(parse(header(kSet, klen) + std::string(64, 'x'), &cmd, &k, &v), 0) << klen;
  std::string m = header(kSet, 1) + "k";
  uint32_t vlen = static_cast<uint32_t>(kMaxValueBytes + 1);
  m.append(reinterpret_cast<const char*>(&vlen), 4);
  EXPECT_LT(parse(m, &cmd, &k, &v), 0);
  EXPECT_LT(parse(encode(0, "k", "v"), &cmd, &k, &v), 0);
  EXPECT_LT(parse(encode(200, "k", "v"), &cmd, &k, &v), 0);
}

TEST(StoreWire, RandomBuffersNeverOverrun) {
  std::mt19937 rng(12);
  uint8_t cmd;
  std::string k, v;
  for (int i = 0; i < 20000; ++i) {
    std::string b(rng() % 40, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    if (!b.empty() && rng() % 2) b[0] = static_cast<char>(1 + rng() % 7);
    long n = parse(b, &cmd, &k, &v);
    ASSERT_LE(n, static_cast<long>(b.size()));
    if (n > 0) {
      EXPECT_EQ(static_cast<size_t>(n), 9 + k.size() + v.size());
    }
  }
}

TEST(StoreWire, KeyListsAreBounded) {
  std::vector<std::string> out;
  EXPECT_TRUE(decodeKeys(encodeKeys({"a", "bc"}), 0, &out));
  EXPECT_EQ(out, (std::vector<std::string>{"a", "bc"}));
  std::string bad = encodeKeys({"a"});
  uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(bad.data() + 4, &huge, 4);
  out.clear();
  EXPECT_FALSE(decodeKeys(bad, 0, &out));
  EXPECT_FALSE(decodeKeys("ab", 0, &out));
  EXPECT_FALSE(decodeKeys("", 5, &out));
}

TEST(Timeouts, DeadlinesSaturate) {
  for (double s : {1e13, 1e300, std::numeric_limits<double>::infinity()}) {
    Deadline d = Deadline::after(s);
    EXPECT_FALSE(d.passed()) << s;
    EXPECT_GT(d.remainingMs(), 1000 * 1000) << s;
    EXPECT_EQ(formatSeconds(s), "inf");
  }
  EXPECT_TRUE(Deadline::after(std::nan("")).passed());
  EXPECT_TRUE(Deadline::after(-5).passed());
  EXPECT_EQ(formatSeconds(-3), "0");
  EXPECT_EQ(formatSeconds(2.5), "2.5");
}

TEST(Timeouts, EnvironmentIsValidated) {
  for (const char* bad : {"0", "-1", "nan", "abc", "5s", "-inf"}) {
    setenv("HARP_TEST_TIMEOUT", bad, 1);
    try {
      env::timeoutOr("HARP_TEST_TIMEOUT", 1);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("HARP_TEST_TIMEOUT"), std::string::npos);
    }
  }
  setenv("HARP_TEST_TIMEOUT", "inf", 1);
  EXPECT_TRUE(std::isinf(env::timeoutOr("HARP_TEST_TIMEOUT", 1)));
  setenv("HARP_TEST_TIMEOUT", "2.5", 1);
  EXPECT_EQ(env::timeoutOr("HARP_TEST_TIMEOUT", 1), 2.5);
  unsetenv("HARP_TEST_TIMEOUT");
  EXPECT_EQ(env::timeoutOr("HARP_TEST_TIMEOUT", 7), 7);
}
