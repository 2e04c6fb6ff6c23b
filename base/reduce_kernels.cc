// Reduction kernels, compiled once per ISA (see CMakeLists: HARP_KERNEL_ISA is
// `generic` or `avx2`). Keep the loops simple: the compiler vectorizes them.
#include <cstdint>
#include <cstring>
#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "base/reduce.h"

#ifndef HARP_KERNEL_ISA
#error "HARP_KERNEL_ISA must be defined"
#endif

namespace harp::kernels::HARP_KERNEL_ISA {
namespace {

inline float bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t floatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct Sum { template <class T> T operator()(T a, T b) const { return a + b; } };
struct Prod { template <class T> T operator()(T a, T b) const { return a * b; } };
struct Min { template <class T> T operator()(T a, T b) const { return b < a ? b : a; } };
struct Max { template <class T> T operator()(T a, T b) const { return a < b ? b : a; } };
struct Band { template <class T> T operator()(T a, T b) const { return a & b; } };
struct Bor { template <class T> T operator()(T a, T b) const { return a | b; } };
struct Bxor { template <class T> T operator()(T a, T b) const { return a ^ b; } };

// Integers: do + and * in the unsigned type so overflow wraps instead of being UB.
template <class T> struct Unsigned { using type = T; };
template <> struct Unsigned<int8_t> { using type = uint8_t; };
template <> struct Unsigned<int32_t> { using type = uint32_t; };
template <> struct Unsigned<int64_t> { using type = uint64_t; };

template <class T, class F>
void loop(void* out, const void* a, const void* b, size_t n, F f) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
}

template <class T>
void intOp(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  using U = typename Unsigned<T>::type;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      loop<U>(out, a, b, n, Sum{});
      break;
    case ReduceOp::kProd:
      // uint8 * uint8 promotes to int; cast back keeps wrap-around semantics.
      loop<U>(out, a, b, n, [](U p, U q) { return static_cast<U>(static_cast<uint64_t>(p) * q); });
      break;
    case ReduceOp::kMin: loop<T>(out, a, b, n, Min{}); break;
    case ReduceOp::kMax: loop<T>(out, a, b, n, Max{}); break;
    case ReduceOp::kBand: loop<U>(out, a, b, n, Band{}); break;
    case ReduceOp::kBor: loop<U>(out, a, b, n, Bor{}); break;
    case ReduceOp::kBxor: loop<U>(out, a, b, n, Bxor{}); break;
  }
}

template <class T>
void floatOp(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: loop<T>(out, a, b, n, Sum{}); break;
    case ReduceOp::kProd: loop<T>(out, a, b, n, Prod{}); break;
    case ReduceOp::kMin: loop<T>(out, a, b, n, Min{}); break;
    case ReduceOp::kMax: loop<T>(out, a, b, n, Max{}); break;
    default: break;  // bitwise ops rejected by checkOpSupported
  }
}

// Narrow floats: widen each element to float, apply, round back.
template <class F>
void halfLoop(void* out, const void* a, const void* b, size_t n, F f) {
  auto* o = static_cast<_Float16*>(out);
  auto* x = static_cast<const _Float16*>(a);
  auto* y = static_cast<const _Float16*>(b);
  size_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  // 8 lanes at a time: widen with vcvtph2ps, apply f on floats, round back
  // (round-to-nearest-even) with vcvtps2ph.
  float fx[8], fy[8], fo[8];
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(fx, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
    _mm256_storeu_ps(fy, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i))));
    for (int k = 0; k < 8; ++k) fo[k] = f(fx[k], fy[k]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(fo), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < n; ++i) o[i] = static_cast<_Float16>(f(static_cast<float>(x[i]), static_cast<float>(y[i])));
}
template <class F>
void bf16Loop(void* out, const void* a, const void* b, size_t n, F f) {
  auto* o = static_cast<uint16_t*>(out);
  auto* x = static_cast<const uint16_t*>(a);
  auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = floatToBf16(f(bf16ToFloat(x[i]), bf16ToFloat(y[i])));
}
template <class Loop>
void narrowOp(Loop l, void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: l(out, a, b, n, Sum{}); break;
    case ReduceOp::kProd: l(out, a, b, n, Prod{}); break;
    case ReduceOp::kMin: l(out, a, b, n, Min{}); break;
    case ReduceOp::kMax: l(out, a, b, n, Max{}); break;
    default: break;
  }
}

void boolOp(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* o = static_cast<uint8_t*>(out);
  auto* x = static_cast<const uint8_t*>(a);
  auto* y = static_cast<const uint8_t*>(b);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      for (size_t i = 0; i < n; ++i) o[i] = (x[i] | y[i]) != 0;
      break;
    case ReduceOp::kProd:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      for (size_t i = 0; i < n; ++i) o[i] = (x[i] != 0) & (y[i] != 0);
      break;
    case ReduceOp::kBxor:
      for (size_t i = 0; i < n; ++i) o[i] = (x[i] != 0) ^ (y[i] != 0);
      break;
    default: break;
  }
}

template <class T>
void divInt(void* buf, size_t n, int d) {
  T* p = static_cast<T*>(buf);
  const T dd = static_cast<T>(d);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / dd;
}
template <class T>
void divFloat(void* buf, size_t n, int d) {
  T* p = static_cast<T*>(buf);
  const T dd = static_cast<T>(d);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / dd;
}

}  // namespace

void reduce(void* out, const void* a, const void* b, size_t n, DataType dt, ReduceOp op) {
  switch (dt) {
    case DataType::kInt8: intOp<int8_t>(out, a, b, n, op); break;
    case DataType::kUint8: intOp<uint8_t>(out, a, b, n, op); break;
    case DataType::kInt32: intOp<int32_t>(out, a, b, n, op); break;
    case DataType::kUint32: intOp<uint32_t>(out, a, b, n, op); break;
    case DataType::kInt64: intOp<int64_t>(out, a, b, n, op); break;
    case DataType::kUint64: intOp<uint64_t>(out, a, b, n, op); break;
    case DataType::kFloat32: floatOp<float>(out, a, b, n, op); break;
    case DataType::kFloat64: floatOp<double>(out, a, b, n, op); break;
    case DataType::kFloat16:
      narrowOp([](void* o, const void* x, const void* y, size_t m, auto f) { halfLoop(o, x, y, m, f); }, out, a, b, n, op);
      break;
    case DataType::kBfloat16:
      narrowOp([](void* o, const void* x, const void* y, size_t m, auto f) { bf16Loop(o, x, y, m, f); }, out, a, b, n, op);
      break;
    case DataType::kBool: boolOp(out, a, b, n, op); break;
  }
}

void finalizeAvg(void* buf, size_t n, DataType dt, int d) {
  switch (dt) {
    case DataType::kInt8: divInt<int8_t>(buf, n, d); break;
    case DataType::kUint8: divInt<uint8_t>(buf, n, d); break;
    case DataType::kInt32: divInt<int32_t>(buf, n, d); break;
    case DataType::kUint32: divInt<uint32_t>(buf, n, d); break;
    case DataType::kInt64: divInt<int64_t>(buf, n, d); break;
    case DataType::kUint64: divInt<uint64_t>(buf, n, d); break;
    case DataType::kFloat32: divFloat<float>(buf, n, d); break;
    case DataType::kFloat64: divFloat<double>(buf, n, d); break;
    case DataType::kFloat16: {
      auto* p = static_cast<_Float16*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<_Float16>(static_cast<float>(p[i]) / d);
      break;
    }
    case DataType::kBfloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = floatToBf16(bf16ToFloat(p[i]) / d);
      break;
    }
    case DataType::kBool: break;
  }
}

}  // namespace harp::kernels::HARP_KERNEL_ISA
