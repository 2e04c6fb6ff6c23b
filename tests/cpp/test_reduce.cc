// Reduction kernels against a scalar reference, every dtype and op, odd lengths
// (vector tails), aliasing (out == a), and fp16/bf16 rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/reduce.h"

using namespace harp;

namespace {
float bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <class T>
T ref(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<T>(a + b);
    case ReduceOp::kProd: return static_cast<T>(a * b);
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    if (op == ReduceOp::kBand) return a & b;
    if (op == ReduceOp::kBor) return a | b;
    if (op == ReduceOp::kBxor) return a ^ b;
  }
  return a;
}

template <class T>
void checkType(DataType dt, std::vector<ReduceOp> ops) {
  std::mt19937 rng(7);
  for (size_t n : {0ul, 1ul, 7ul, 31ul, 1000ul, 4099ul}) {
    std::vector<T> a(n), b(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(static_cast<int>(rng() % 200) - (std::is_signed_v<T> ? 100 : 0));
      b[i] = static_cast<T>(static_cast<int>(rng() % 200) - (std::is_signed_v<T> ? 100 : 0));
    }
    for (ReduceOp op : ops) {
      reduce(out.data(), a.data(), b.data(), n, dt, op);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], ref(a[i], b[i], op)) << dtypeName(dt) << " " << opName(op) << " i=" << i;
      std::vector<T> alias = a;  // out aliases the first input
      reduce(alias.data(), alias.data(), b.data(), n, dt, op);
      ASSERT_EQ(alias, out);
    }
  }
}
}  // namespace

TEST(Reduce, Integers) {
  std::vector<ReduceOp> all{ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};
  checkType<int8_t>(DataType::kInt8, all);
  checkType<uint8_t>(DataType::kUint8, all);
  checkType<int32_t>(DataType::kInt32, all);
  checkType<uint32_t>(DataType::kUint32, all);
  checkType<int64_t>(DataType::kInt64, all);
  checkType<uint64_t>(DataType::kUint64, all);
}

TEST(Reduce, Floats) {
  std::vector<ReduceOp> ops{ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax};
  checkType<float>(DataType::kFloat32, ops);
  checkType<double>(DataType::kFloat64, ops);
}

TEST(Reduce, IntegerOverflowWraps) {
  int8_t a[2] = {127, -128}, b[2] = {1, -1}, out[2];
  reduce(out, a, b, 2, DataType::kInt8, ReduceOp::kSum);
  EXPECT_EQ(out[0], -128);
  EXPECT_EQ(out[1], 127);
}

TEST(Reduce, Float16RoundsEachStep) {
  const size_t n = 1003;
  std::vector<_Float16> a(n), b(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<_Float16>(0.1f * i);
    b[i] = static_cast<_Float16>(1.0f / (i + 1));
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
    reduce(out.data(), a.data(), b.data(), n, DataType::kFloat16, op);
    for (size_t i = 0; i < n; ++i) {
      float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
      float r = op == ReduceOp::kSum ? x + y : op == ReduceOp::kProd ? x * y : op == ReduceOp::kMin ? std::min(x, y) : std::max(x, y);
      ASSERT_EQ(static_cast<float>(out[i]), static_cast<float>(static_cast<_Float16>(r))) << opName(op) << " " << i;
    }
  }
}

TEST(Reduce, Bfloat16RoundsToNearestEven) {
  const size_t n = 517;
  std::vector<uint16_t> a(n), b(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = toBf16(1.0f + 0.37f * i);
    b[i] = toBf16(-0.5f * i + 3.0f);
  }
  reduce(out.data(), a.data(), b.data(), n, DataType::kBfloat16, ReduceOp::kSum);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], toBf16(bf16(a[i]) + bf16(b[i]))) << i;
  finalizeAvg(out.data(), n, DataType::kBfloat16, 3);
  std::vector<uint16_t> exp(n);
  for (size_t i = 0; i < n; ++i) exp[i] = toBf16(bf16(toBf16(bf16(a[i]) + bf16(b[i]))) / 3);
  EXPECT_EQ(out, exp);
}

TEST(Reduce, BoolIsLogical) {
  uint8_t a[4] = {0, 1, 0, 1}, b[4] = {0, 0, 1, 1}, out[4];
  reduce(out, a, b, 4, DataType::kBool, ReduceOp::kSum);
  EXPECT_EQ(std::vector<uint8_t>(out, out + 4), (std::vector<uint8_t>{0, 1, 1, 1}));
  reduce(out, a, b, 4, DataType::kBool, ReduceOp::kProd);
  EXPECT_EQ(std::vector<uint8_t>(out, out + 4), (std::vector<uint8_t>{0, 0, 0, 1}));
  reduce(out, a, b, 4, DataType::kBool, ReduceOp::kBxor);
  EXPECT_EQ(std::vector<uint8_t>(out, out + 4), (std::vector<uint8_t>{0, 1, 1, 0}));
}

TEST(Reduce, AvgTruncatesIntegers) {
  int32_t v[3] = {7, -7, 8};
  finalizeAvg(v, 3, DataType::kInt32, 2);
  EXPECT_EQ(v[0], 3);
  EXPECT_EQ(v[1], -3);
  EXPECT_EQ(v[2], 4);
}

TEST(Types, OpSupport) {
  EXPECT_THROW(checkOpSupported(DataType::kFloat32, ReduceOp::kBand), Error);
  EXPECT_THROW(checkOpSupported(DataType::kBool, ReduceOp::kAvg), Error);
  EXPECT_NO_THROW(checkOpSupported(DataType::kInt8, ReduceOp::kBxor));
  EXPECT_THROW(parseOp("median"), Error);
  EXPECT_EQ(parseDtype("half"), DataType::kFloat16);
}
