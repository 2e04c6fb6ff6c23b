// core/reduce.h — elementwise reduction kernels.
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

#include "core/types.h"

namespace harp {

void reduce(void* out, const void* a, const void* b, size_t n, DataType dt, ReduceOp op);
// buf[i] = buf[i] / divisor, in the element type (integers truncate toward zero).
void finalizeAvg(void* buf, size_t n, DataType dt, int divisor);
// Which kernel set is in use ("avx2" or "generic").
const char* reduceKernelName();

namespace kernels {
// One instance per ISA; see reduce_kernels.inc.
using ReduceFn = void (*)(void*, const void*, const void*, size_t, DataType, ReduceOp);
using AvgFn = void (*)(void*, size_t, DataType, int);
}  // namespace kernels
}  // namespace harp
