// base/reduce.cc — picks the kernel set once at load time (CPU features).
//
// Test hook: when the process defines the C symbol `harp_test_reduce_hook`
// (tests/bench_broken_reduce.c, LD_PRELOADed by tests/test_bench.py), every
// reduce() calls it after the kernel with (out, n, element size), and the hook
// may corrupt the output. It is looked up once, with dlsym, when the kernels
// are chosen; without it the dispatch pointer is the kernel itself, so the
// hook costs nothing in a normal process.
#include "base/reduce.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

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
using TestHook = void (*)(void* out, size_t n, size_t elemSize);
kernels::ReduceFn g_kernel;  // the real kernel, when the test hook wraps it
TestHook g_hook;

void hookedReduce(void* out, const void* a, const void* b, size_t n, DataType dt, ReduceOp op) {
  g_kernel(out, a, b, n, dt, op);
  g_hook(out, n, dtypeSize(dt));
}

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
    if (auto h = reinterpret_cast<TestHook>(dlsym(RTLD_DEFAULT, "harp_test_reduce_hook"))) {
      g_kernel = reduce;
      g_hook = h;
      reduce = hookedReduce;
    }
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

namespace {
template <class T>
void widen(int64_t* w, const void* in, size_t n) {
  const T* x = static_cast<const T*>(in);
  for (size_t i = 0; i < n; ++i) w[i] = static_cast<int64_t>(x[i]);  // uint32 fits, uint8 fits
}
template <class T>
void narrow(void* out, const int64_t* w, size_t n, int64_t p) {
  T* o = static_cast<T*>(out);
  if (std::is_signed<T>::value) {
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(w[i] / p);  // C++ division truncates
  } else {
    const uint64_t* u = reinterpret_cast<const uint64_t*>(w);
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(u[i] / static_cast<uint64_t>(p));
  }
}
}  // namespace

size_t wideAvgWidth(DataType dt) { return dt == DataType::kInt64 || dt == DataType::kUint64 ? 2 : 1; }

void wideAvgIn(int64_t* w, const void* in, size_t n, DataType dt, int p) {
  switch (dt) {
    case DataType::kInt8: return widen<int8_t>(w, in, n);
    case DataType::kUint8: return widen<uint8_t>(w, in, n);
    case DataType::kInt32: return widen<int32_t>(w, in, n);
    case DataType::kUint32: return widen<uint32_t>(w, in, n);
    case DataType::kInt64: {
      const int64_t* x = static_cast<const int64_t*>(in);
      for (size_t i = 0; i < n; ++i) {
        int64_t q = x[i] / p, r = x[i] % p;
        if (r < 0) --q, r += p;  // floor division: 0 <= r < p
        w[i] = q;
        w[n + i] = r;
      }
      return;
    }
    case DataType::kUint64: {
      const uint64_t* x = static_cast<const uint64_t*>(in);
      uint64_t* u = reinterpret_cast<uint64_t*>(w);
      for (size_t i = 0; i < n; ++i) u[i] = x[i] / p, u[n + i] = x[i] % p;
      return;
    }
    default: throw InvalidArgument(std::string("wideAvgIn: not an integer type: ") + dtypeName(dt));
  }
}

void wideAvgOut(void* out, const int64_t* w, size_t n, DataType dt, int p) {
  switch (dt) {
    case DataType::kInt8: return narrow<int8_t>(out, w, n, p);
    case DataType::kUint8: return narrow<uint8_t>(out, w, n, p);
    case DataType::kInt32: return narrow<int32_t>(out, w, n, p);
    case DataType::kUint32: return narrow<uint32_t>(out, w, n, p);
    case DataType::kInt64: {
      // sum = p*Q + R with 0 <= R < p^2: floor(sum/p) = Q + R div p; truncate
      // toward zero: one more when negative with a remainder.
      int64_t* o = static_cast<int64_t*>(out);
      for (size_t i = 0; i < n; ++i) {
        const int64_t q = w[i], r = w[n + i];
        const int64_t f = q + r / p;
        o[i] = f + (f < 0 && r % p != 0 ? 1 : 0);
      }
      return;
    }
    case DataType::kUint64: {
      const uint64_t* u = reinterpret_cast<const uint64_t*>(w);
      uint64_t* o = static_cast<uint64_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = u[i] + u[n + i] / static_cast<uint64_t>(p);
      return;
    }
    default: throw InvalidArgument(std::string("wideAvgOut: not an integer type: ") + dtypeName(dt));
  }
}

}  // namespace harp
