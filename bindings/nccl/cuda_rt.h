// bindings/nccl/cuda_rt.h — the CUDA runtime, loaded with dlopen at run time.
//
// libharp-nccl.so never links CUDA: on first use it takes the libcudart the
// process has already loaded (torch, cupy...), else HARP_CUDART (a path), else
// libcudart.so.12/.13/.11.0/libcudart.so from the library path. When none loads, when
// no device is visible, or when HARP_NCCL_CUDA=0, CUDA is "absent" and every
// buffer is treated as host memory. Only the handful of entry points the NCCL
// layer needs are resolved; their types are declared here (CUDA 11+ ABI), so
// no CUDA header is needed to build.
//
// Thread-safe: loading happens once (std::call_once); the function pointers
// are then read-only.
#pragma once

#include <cstddef>
#include <string>

namespace harp::cuda {

using Stream = void*;  // cudaStream_t
using Event = void*;   // cudaEvent_t
using HostFn = void (*)(void*);

// cudaMemoryType (CUDA 11+): what a pointer points to.
enum MemType { kUnregistered = 0, kHost = 1, kDevice = 2, kManaged = 3 };

struct Api {
  int (*getDeviceCount)(int*);
  int (*getDevice)(int*);
  int (*setDevice)(int);
  int (*pointerGetAttributes)(void* attr, const void* ptr);
  int (*getLastError)();
  const char* (*getErrorString)(int);
  int (*malloc)(void**, size_t);
  int (*free)(void*);
  int (*hostAlloc)(void**, size_t, unsigned);
  int (*freeHost)(void*);
  int (*memcpy)(void*, const void*, size_t, int);
  int (*memcpyAsync)(void*, const void*, size_t, int, Stream);
  int (*eventCreateWithFlags)(Event*, unsigned);
  int (*eventRecord)(Event, Stream);
  int (*eventSynchronize)(Event);
  int (*eventDestroy)(Event);
  int (*streamWaitEvent)(Stream, Event, unsigned);
  int (*streamSynchronize)(Stream);
  int (*launchHostFunc)(Stream, HostFn, void*);
  int (*runtimeGetVersion)(int*);
  int (*streamIsCapturing)(Stream, int*);  // optional (nullptr if absent)
};

// nullptr when CUDA is absent (see above). why() says why it is absent.
const Api* api();
std::string why();

// Memory type of `p` (kUnregistered for plain host memory; always
// kUnregistered when CUDA is absent). Device/managed memory needs staging.
MemType memType(const void* p);
inline bool isDevice(const void* p) {
  MemType t = memType(p);
  return t == kDevice || t == kManaged;
}

// Throws harp::Error(kSystem) "<what>: <cuda error text>" when rc != 0.
void check(int rc, const char* what);

constexpr int kMemcpyDefault = 4;        // cudaMemcpyDefault (UVA)
constexpr unsigned kHostAllocPortable = 1;
constexpr unsigned kEventDisableTiming = 2;

}  // namespace harp::cuda
