// base/reduce.h — elementwise reduction kernels.
//
// reduce(out, a, b, n): out[i] = op(a[i], b[i]). `out` may alias `a` or `b`.
// AVG reduces as SUM; the division happens once, at the end, in finalizeAvg.
// float16 and bfloat16 are widened to float32 for each step and rounded back
// (round-to-nearest-even), so nothing is accumulated in a narrower type than
// the input. Integer sums and products wrap around (two's complement). bool
// follows logical semantics: sum/max/bor = or, prod/min/band = and, bxor = xor.
//
// Kernels are compiled twice (baseline x86-64 and AVX2+F16C+FMA) and chosen
// once at load time by CPU features. Pure functions: any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/types.h"

namespace harp {

void reduce(void* out, const void* a, const void* b, size_t n, DataType dt, ReduceOp op);
// buf[i] = buf[i] / divisor, in the element type (integers truncate toward zero).
void finalizeAvg(void* buf, size_t n, DataType dt, int divisor);
// Integer avg without wrap-around (Communicator::runIntAvg). 8/32-bit types
// travel as one 64-bit word per element (their sum cannot overflow); 64-bit
// types as two words, x div p (floor) and x mod p, in two halves of the wide
// buffer. wideAvgWidth: words per element; wideAvgIn: n elements of `in` into
// `wide`; wideAvgOut: the summed words back to the exact average, truncated
// toward zero, as `dt`.
size_t wideAvgWidth(DataType dt);
void wideAvgIn(int64_t* wide, const void* in, size_t n, DataType dt, int p);
void wideAvgOut(void* out, const int64_t* wide, size_t n, DataType dt, int p);
// Which kernel set is in use ("avx2" or "generic").
const char* reduceKernelName();

namespace kernels {
// One instance per ISA; see reduce_kernels.inc.
using ReduceFn = void (*)(void*, const void*, const void*, size_t, DataType, ReduceOp);
using AvgFn = void (*)(void*, size_t, DataType, int);
}  // namespace kernels
}  // namespace harp
