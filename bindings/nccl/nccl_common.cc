// bindings/nccl/nccl_common.cc — shared machinery of the NCCL layer: error
// codes and texts, type mapping, the per-communicator engine that runs
// device-buffer jobs in stream order, the pinned staging pool, and the
// call counter / INFO banner that show HARP is serving the calls.
//
// Threading: see nccl_internal.h. The last-error text is per thread, with a
// process-wide copy for ncclGetLastError calls made from another thread.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "bindings/nccl/nccl_internal.h"
#include "base/log.h"
#include "base/reduce.h"

#ifndef HARP_VERSION_STRING
#define HARP_VERSION_STRING "unknown"
#endif

namespace harp::nccl {
namespace {
std::atomic<unsigned long long> g_served{0};
thread_local std::string t_last_error;
std::mutex g_last_mu;
std::string g_last_error;
}  // namespace

// ---------------------------------------------------------------------------
// Errors

void setLastError(const std::string& text) {
  t_last_error = text;
  std::lock_guard<std::mutex> g(g_last_mu);
  g_last_error = text;
}

const std::string& lastError() {
  if (!t_last_error.empty()) return t_last_error;
  static thread_local std::string copy;
  std::lock_guard<std::mutex> g(g_last_mu);
  copy = g_last_error;
  return copy;
}

ncclResult_t resultOf(const std::exception& e) {
  auto* he = dynamic_cast<const Error*>(&e);
  if (!he) return ncclInternalError;
  switch (he->kind()) {
    case Error::kInvalidArgument: return ncclInvalidArgument;
    case Error::kMismatch: return ncclInvalidUsage;
    case Error::kPeerFailure: return ncclRemoteError;
    case Error::kTimeout: return ncclRemoteError;
    case Error::kSystem:
      return std::strstr(he->what(), "cuda error") ? ncclUnhandledCudaError : ncclSystemError;
    case Error::kUnavailable: return ncclSystemError;
    case Error::kRevoked: return ncclRemoteError;
    default: return ncclInternalError;
  }
}

ncclResult_t fail(ncclResult_t r, const std::string& text) {
  setLastError(text);
  HARP_INFO("nccl: %s", text.c_str());
  return r;
}

ncclResult_t failFrom(const std::exception& e) { return fail(resultOf(e), e.what()); }

void ncclCommImpl::setAsyncError(ncclResult_t r, const std::string& text) {
  std::lock_guard<std::mutex> g(err_mu);
  if (async_error.load() != ncclSuccess) return;
  error_text = text;
  async_error.store(r);
}

ncclCommImpl* impl(ncclComm_t c) {
  if (!c || c->magic != kCommMagic) return nullptr;
  return c;
}

// ---------------------------------------------------------------------------
// Types

DataType toDtype(ncclDataType_t d) {
  switch (static_cast<int>(d)) {
    case ncclInt8: return DataType::kInt8;
    case ncclUint8: return DataType::kUint8;
    case ncclInt32: return DataType::kInt32;
    case ncclUint32: return DataType::kUint32;
    case ncclInt64: return DataType::kInt64;
    case ncclUint64: return DataType::kUint64;
    case ncclFloat16: return DataType::kFloat16;
    case ncclFloat32: return DataType::kFloat32;
    case ncclFloat64: return DataType::kFloat64;
    case ncclBfloat16: return DataType::kBfloat16;
  }
  throw InvalidArgument("invalid ncclDataType_t " + std::to_string(static_cast<int>(d)) +
                        " (valid: 0..9, ncclInt8..ncclBfloat16)");
}

size_t ncclTypeSize(ncclDataType_t d) { return dtypeSize(toDtype(d)); }

void scaleCopy(void* dst, const void* src, size_t count, ncclDataType_t dt, const void* scalar) {
  // dst = scalar (broadcast), then dst = dst * src with the core's kernels
  // (which round float16/bfloat16 correctly).
  const size_t es = ncclTypeSize(dt);
  char* d = static_cast<char*>(dst);
  for (size_t i = 0; i < count; ++i) std::memcpy(d + i * es, scalar, es);
  reduce(dst, dst, src, count, toDtype(dt), ReduceOp::kProd);
}

// ---------------------------------------------------------------------------
// Served-call counter and banner

void served() { g_served.fetch_add(1, std::memory_order_relaxed); }

void banner() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* nd = std::getenv("NCCL_DEBUG");
    bool nccl_info = nd && (!strcasecmp(nd, "INFO") || !strcasecmp(nd, "TRACE"));
    if (logLevel() < LogLevel::kInfo && !nccl_info) return;
    Dl_info info{};
    const char* path = dladdr(reinterpret_cast<void*>(&banner), &info) && info.dli_fname ? info.dli_fname : "?";
    std::string cuda = cuda::api() ? "CUDA device buffers staged through pinned host memory"
                                   : "host buffers only (" + cuda::why() + ")";
    std::fprintf(stderr, "HARP %s serving the NCCL %d.%d.%d API from %s; %s\n", HARP_VERSION_STRING, NCCL_MAJOR,
                 NCCL_MINOR, NCCL_PATCH, path, cuda.c_str());
  });
}

// ---------------------------------------------------------------------------
// Jobs and the engine

void Job::finish(ncclResult_t r, const std::string& e) {
  {
    std::lock_guard<std::mutex> g(mu);
    done = true;
    result = r;
    error = e;
  }
  cv.notify_all();
}

void Job::waitDone() {
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done; });
}

void runJob(Job& j) {
  ncclCommImpl* c = j.comm;
  try {
    if (j.ready) cuda::check(cuda::api()->eventSynchronize(j.ready), "cudaEventSynchronize (input copies)");
    for (auto& p : j.prescale) {
      unsigned char scalar[8];
      if (p.op.immediate) {
        std::memcpy(scalar, p.op.value, sizeof scalar);
      } else if (cuda::isDevice(p.op.ptr)) {
        cuda::check(cuda::api()->memcpy(scalar, p.op.ptr, ncclTypeSize(p.dtype), cuda::kMemcpyDefault),
                    "cudaMemcpy (PreMulSum scalar)");
      } else {
        std::memcpy(scalar, p.op.ptr, ncclTypeSize(p.dtype));
      }
      scaleCopy(p.dst, p.src, p.count, p.dtype, scalar);
    }
    for (auto& a : j.colls) c->comm->submit(a, false);
    j.finish(ncclSuccess, "");
  } catch (const std::exception& e) {
    ncclResult_t r = resultOf(e);
    if (c->comm && c->comm->broken()) c->setAsyncError(r, e.what());
    j.finish(r, e.what());
  }
}

Engine::~Engine() { stop(); }

void Engine::enqueue(std::shared_ptr<Job> j) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!th_.joinable()) th_ = std::thread([this] { loop(); });
    q_.push_back(std::move(j));
  }
  cv_.notify_one();
}

void Engine::drain() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [&] { return q_.empty() && !running_; });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (th_.joinable()) th_.join();
}

void Engine::loop() {
  if (const cuda::Api* a = cuda::api()) {  // copies and events of this communicator's device
    if (a->setDevice(comm_->cuda_dev) != 0) a->getLastError();
  }
  for (;;) {
    std::shared_ptr<Job> j;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      j = std::move(q_.front());
      q_.pop_front();
      running_ = true;
    }
    runJob(*j);
    {
      std::lock_guard<std::mutex> g(mu_);
      running_ = false;
    }
    idle_cv_.notify_all();
  }
}

// ---------------------------------------------------------------------------
// Pinned staging pool

void* ncclCommImpl::acquirePinned(size_t bytes, size_t* cap) {
  size_t want = 4096;
  while (want < bytes) want *= 2;
  {
    std::lock_guard<std::mutex> g(pool_mu);
    auto it = free_pinned.find(want);
    if (it != free_pinned.end()) {
      void* p = it->second;
      free_pinned.erase(it);
      *cap = want;
      return p;
    }
  }
  void* p = nullptr;
  cuda::check(cuda::api()->hostAlloc(&p, want, cuda::kHostAllocPortable), "cudaHostAlloc (staging buffer)");
  std::lock_guard<std::mutex> g(pool_mu);
  all_pinned.push_back(p);
  *cap = want;
  return p;
}

void ncclCommImpl::releasePinned(void* p, size_t cap) {
  std::lock_guard<std::mutex> g(pool_mu);
  free_pinned.emplace(cap, p);
}

cuda::Event ncclCommImpl::acquireEvent() {
  {
    std::lock_guard<std::mutex> g(pool_mu);
    if (!free_events.empty()) {
      cuda::Event e = free_events.back();
      free_events.pop_back();
      return e;
    }
  }
  cuda::Event e = nullptr;
  cuda::check(cuda::api()->eventCreateWithFlags(&e, cuda::kEventDisableTiming), "cudaEventCreateWithFlags");
  std::lock_guard<std::mutex> g(pool_mu);
  all_events.push_back(e);
  return e;
}

void ncclCommImpl::releaseEvent(cuda::Event e) {
  std::lock_guard<std::mutex> g(pool_mu);
  free_events.push_back(e);
}

void ncclCommImpl::freePools() {
  const cuda::Api* a = cuda::api();
  std::lock_guard<std::mutex> g(pool_mu);
  if (a) {
    for (void* p : all_pinned) a->freeHost(p);
    for (cuda::Event e : all_events) a->eventDestroy(e);
  }
  all_pinned.clear();
  free_pinned.clear();
  all_events.clear();
  free_events.clear();
}

}  // namespace harp::nccl

// Number of NCCL API calls this library has served in this process (HARP
// extension; tests find it with dlsym to prove a preload took effect).
extern "C" __attribute__((visibility("default"))) unsigned long long harpNcclCallsServed(void) {
  return harp::nccl::g_served.load();
}
