// bindings/nccl/cuda_rt.cc — dlopen of libcudart; see cuda_rt.h.
#include "bindings/nccl/cuda_rt.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "base/env.h"
#include "base/log.h"
#include "base/types.h"

namespace harp::cuda {
namespace {

Api g_api;
bool g_ok = false;
std::string g_why = "not loaded yet";
std::once_flag g_once;

// cudaPointerAttributes, CUDA 11+ layout (with room to spare).
struct PointerAttributes {
  int type;
  int device;
  void* devicePointer;
  void* hostPointer;
  char reserved[64];
};

template <typename F>
bool resolve(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

void load() {
  const char* off = env::raw("HARP_NCCL_CUDA");
  if (off && std::string(off) == "0") {
    g_why = "disabled by HARP_NCCL_CUDA=0";
    return;
  }
  std::string tried;
  void* lib = nullptr;
  const char* user = env::raw("HARP_CUDART");
  const char* names[] = {"libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"};
  // The runtime the application already uses (torch, cupy...), so streams and
  // pointers come from the same one; then HARP_CUDART; then any.
  if (user && *user) lib = dlopen(user, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  for (const char* name : names) {
    if (lib) break;
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  }
  if (!lib && user && *user) {
    lib = dlopen(user, RTLD_NOW | RTLD_LOCAL);
    if (!lib) tried = user;
  }
  for (const char* name : names) {
    if (lib) break;
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) tried += std::string(tried.empty() ? "" : ", ") + name;
  }
  if (!lib) {
    g_why = "libcudart not found (tried " + tried + ")";
    return;
  }
  Api a{};
  bool ok = resolve(lib, "cudaGetDeviceCount", a.getDeviceCount) && resolve(lib, "cudaGetDevice", a.getDevice) &&
            resolve(lib, "cudaSetDevice", a.setDevice) &&
            resolve(lib, "cudaPointerGetAttributes", a.pointerGetAttributes) &&
            resolve(lib, "cudaGetLastError", a.getLastError) && resolve(lib, "cudaGetErrorString", a.getErrorString) &&
            resolve(lib, "cudaMalloc", a.malloc) && resolve(lib, "cudaFree", a.free) &&
            resolve(lib, "cudaHostAlloc", a.hostAlloc) && resolve(lib, "cudaFreeHost", a.freeHost) &&
            resolve(lib, "cudaMemcpy", a.memcpy) && resolve(lib, "cudaMemcpyAsync", a.memcpyAsync) &&
            resolve(lib, "cudaEventCreateWithFlags", a.eventCreateWithFlags) &&
            resolve(lib, "cudaEventRecord", a.eventRecord) && resolve(lib, "cudaEventSynchronize", a.eventSynchronize) &&
            resolve(lib, "cudaEventDestroy", a.eventDestroy) && resolve(lib, "cudaStreamWaitEvent", a.streamWaitEvent) &&
            resolve(lib, "cudaStreamSynchronize", a.streamSynchronize) &&
            resolve(lib, "cudaLaunchHostFunc", a.launchHostFunc) &&
            resolve(lib, "cudaRuntimeGetVersion", a.runtimeGetVersion);
  resolve(lib, "cudaStreamIsCapturing", a.streamIsCapturing);  // optional
  if (!ok) {
    g_why = "libcudart lacks an entry point HARP needs (CUDA >= 11 required)";
    return;
  }
  int n = 0, rc = a.getDeviceCount(&n);
  if (rc != 0 || n <= 0) {
    g_why = rc != 0 ? std::string("cudaGetDeviceCount: ") + a.getErrorString(rc) : "no CUDA device visible";
    a.getLastError();
    return;
  }
  int ver = 0;
  a.runtimeGetVersion(&ver);
  if (ver < 11000) {
    g_why = "CUDA runtime " + std::to_string(ver) + " is older than 11.0";
    return;
  }
  g_api = a;
  g_ok = true;
  g_why = "";
  HARP_INFO("nccl: CUDA runtime %d loaded, %d device(s): device buffers are staged through pinned host memory", ver, n);
}

}  // namespace

const Api* api() {
  std::call_once(g_once, load);
  return g_ok ? &g_api : nullptr;
}

std::string why() {
  api();
  return g_why;
}

MemType memType(const void* p) {
  const Api* a = api();
  if (!a || !p) return kUnregistered;
  PointerAttributes attr{};
  int rc = a->pointerGetAttributes(&attr, p);
  if (rc != 0) {  // older runtimes: plain host memory is an error
    a->getLastError();
    return kUnregistered;
  }
  if (attr.type < 0 || attr.type > 3) return kUnregistered;
  return static_cast<MemType>(attr.type);
}

void check(int rc, const char* what) {
  if (rc == 0) return;
  const Api* a = api();
  std::string msg = a ? a->getErrorString(rc) : "CUDA error";
  if (a) a->getLastError();
  throw Error(Error::kSystem, std::string(what) + ": " + msg + " (cuda error " + std::to_string(rc) + ")");
}

}  // namespace harp::cuda
