#include "core/reduce.h"

namespace harp {
namespace kernels {
namespace generic {
void reduce(void*, const void*, const void*, size_t, DataType, ReduceOp);
void finalizeAvg(void*, size_t, DataType, int);
}  // namespace generic
#ifdef HARP_HAVE_AVX2_KERNELS
namespace avx2 {
void reduce(void*, const void*, const void*, size_t, DataType, ReduceOp);
void finalizeAvg(void*, size_t, DataType, int);
}  // namespace avx2
#endif
}  // namespace kernels

namespace {
struct Dispatch {
  kernels::ReduceFn reduce = kernels::generic::reduce;
  kernels::AvgFn avg = kernels::generic::finalizeAvg;
  const char* name = "generic";
  Dispatch() {
#ifdef HARP_HAVE_AVX2_KERNELS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      reduce = kernels::avx2::reduce;
      avg = kernels::avx2::finalizeAvg;
      name = "avx2";
    }
#endif
  }
};
const Dispatch& dispatch() {
  static const Dispatch d;
  return d;
}
}  // namespace

void reduce(void* out, const void* a, const void* b, size_t n, DataType dt, ReduceOp op) {
  if (n) dispatch().reduce(out, a, b, n, dt, op);
}
void finalizeAvg(void* buf, size_t n, DataType dt, int divisor) {
  if (n) dispatch().avg(buf, n, dt, divisor);
}
const char* reduceKernelName() { return dispatch().name; }

}  // namespace harp
