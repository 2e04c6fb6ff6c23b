// Conversion kernels of wire compression (core/compress/compress.h): float32 <->
// fp16/bf16 with round-to-nearest-even, and the fused "a + widen(b)" the
// compressed ring reduces with. Three versions of each, chosen once by CPU
// features: AVX-512F (vcvtps2ph/vcvtph2ps on 16 lanes), AVX2+F16C (8 lanes;
// bf16 as integer intrinsics), scalar. On AVX-512 bf16 is the scalar rule
// left to the compiler's vectorizer.
// NaN stays NaN (quiet), overflow rounds to inf, fp16 subnormals are exact
// (F16C and the scalar code agree bit for bit; tests/test_compress.py checks
// both against numpy).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/compress/compress.h"

namespace harp {
namespace {

// ---- scalar ---------------------------------------------------------------
inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32ToF16(float f) {
  const uint32_t x = bitsOf(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((ax >> 13) & 0x3ffu);  // quiet NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (inf stays inf)
  if (ax < 0x38800000u) {  // below 2^-14: subnormal fp16, in units of 2^-24 (exact scaling)
    return sign | static_cast<uint16_t>(std::nearbyint(floatOf(ax) * 16777216.0f));
  }
  ax += 0xfffu + ((ax >> 13) & 1u);  // round to nearest even at bit 13
  return sign | static_cast<uint16_t>((ax - 0x38000000u) >> 13);  // rebias 127 -> 15
}

inline float f16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return floatOf(sign | 0x7f800000u | (m << 13));
  return floatOf(sign | ((e + 112u) << 23) | (m << 13));
}

inline uint16_t f32ToBf16(float f) {
  uint32_t u = bitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16ToF32(uint16_t h) { return floatOf(static_cast<uint32_t>(h) << 16); }

void narrowF16Scalar(uint16_t* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f32ToF16(s[i]);
}
void widenF16Scalar(float* d, const uint16_t* s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f16ToF32(s[i]);
}
void addF16Scalar(float* d, const float* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = a[i] + f16ToF32(b[i]);
}
void narrowBf16Scalar(uint16_t* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f32ToBf16(s[i]);
}
void widenBf16Scalar(float* d, const uint16_t* s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = bf16ToF32(s[i]);
}
void addBf16Scalar(float* d, const float* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = a[i] + bf16ToF32(b[i]);
}

// ---- AVX2 + F16C ----------------------------------------------------------
#define TARGET_AVX2 __attribute__((target("avx2,f16c,fma")))
TARGET_AVX2 void narrowF16Avx2(uint16_t* d, const float* s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = f32ToF16(s[i]);
}
TARGET_AVX2 void widenF16Avx2(float* d, const uint16_t* s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = f16ToF32(s[i]);
}
TARGET_AVX2 void addF16Avx2(float* d, const float* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(a + i), w));
  }
  for (; i < n; ++i) d[i] = a[i] + f16ToF32(b[i]);
}
// bf16: the scalar rule on 8 lanes (round: + 0x7fff + lsb, NaN: quiet), packed to 16 bits.
TARGET_AVX2 void narrowBf16Avx2(uint16_t* d, const float* s, size_t n) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(s + i));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) d[i] = f32ToBf16(s[i]);
}
TARGET_AVX2 inline __m256 bf16x8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
TARGET_AVX2 void widenBf16Avx2(float* d, const uint16_t* s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, bf16x8(s + i));
  for (; i < n; ++i) d[i] = bf16ToF32(s[i]);
}
TARGET_AVX2 void addBf16Avx2(float* d, const float* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(a + i), bf16x8(b + i)));
  for (; i < n; ++i) d[i] = a[i] + bf16ToF32(b[i]);
}

// ---- AVX-512F -------------------------------------------------------------
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own undefined-vector helpers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))
TARGET_AVX512 void narrowF16Avx512(uint16_t* d, const float* s, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = f32ToF16(s[i]);
}
TARGET_AVX512 void widenF16Avx512(float* d, const uint16_t* s, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  for (; i < n; ++i) d[i] = f16ToF32(s[i]);
}
TARGET_AVX512 void addF16Avx512(float* d, const float* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
    _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(a + i), w));
  }
  for (; i < n; ++i) d[i] = a[i] + f16ToF32(b[i]);
}
TARGET_AVX512 void narrowBf16Avx512(uint16_t* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f32ToBf16(s[i]);
}
TARGET_AVX512 void widenBf16Avx512(float* d, const uint16_t* s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = bf16ToF32(s[i]);
}
TARGET_AVX512 void addBf16Avx512(float* d, const float* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = a[i] + bf16ToF32(b[i]);
}

#pragma GCC diagnostic pop

const NarrowKernels kF16Scalar{narrowF16Scalar, widenF16Scalar, addF16Scalar, "scalar"};
const NarrowKernels kBf16Scalar{narrowBf16Scalar, widenBf16Scalar, addBf16Scalar, "scalar"};
const NarrowKernels kF16Avx2{narrowF16Avx2, widenF16Avx2, addF16Avx2, "avx2"};
const NarrowKernels kBf16Avx2{narrowBf16Avx2, widenBf16Avx2, addBf16Avx2, "avx2"};
const NarrowKernels kF16Avx512{narrowF16Avx512, widenF16Avx512, addF16Avx512, "avx512"};
const NarrowKernels kBf16Avx512{narrowBf16Avx512, widenBf16Avx512, addBf16Avx512, "avx512"};

int bestIsa() {  // 2: AVX-512F+BW, 1: AVX2+F16C, 0: scalar
  static const int isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma")) return 1;
    return 0;
  }();
  return isa;
}

}  // namespace

const NarrowKernels& narrowKernels(CompressKind kind, const std::string& isa) {
  const bool f16 = kind == CompressKind::kFp16;
  if (kind != CompressKind::kFp16 && kind != CompressKind::kBf16)
    throw InvalidArgument("narrow kernels exist for fp16 and bf16 only");
  int level = bestIsa();
  if (isa == "scalar") level = 0;
  else if (isa == "avx2") level = std::min(level, 1);
  else if (isa != "auto") throw InvalidArgument("unknown kernel isa '" + isa + "' (auto, avx2, scalar)");
  if (level == 2) return f16 ? kF16Avx512 : kBf16Avx512;
  if (level == 1) return f16 ? kF16Avx2 : kBf16Avx2;
  return f16 ? kF16Scalar : kBf16Scalar;
}

}  // namespace harp
