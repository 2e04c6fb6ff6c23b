// bindings/nccl/nccl_init.cc — NCCL API: version, unique ids, communicator
// creation (rank, config, all-in-one-process, split), finalize/destroy/abort,
// queries, errors, buffer registration, memory, PreMulSum operators.
//
// Creation maps to harp::Communicator::create over the unique id's bootstrap
// store. Inside ncclGroupStart/End, or with config.blocking = 0, creation runs
// later / in the background and the handle reports ncclInProgress until done.
//
// Threading: as NCCL. Abort may be called from another thread while a call is
// blocked on the communicator: it breaks the communicator (every rank's pending
// calls fail with ncclRemoteError) and frees it once those calls have returned.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>

#include "bindings/nccl/nccl_export.h"
#include "bindings/nccl/nccl_internal.h"
#include "bootstrap/bootstrap.h"
#include "base/log.h"

#ifndef HARP_VERSION_STRING
#define HARP_VERSION_STRING "unknown"
#endif

using namespace harp;
using namespace harp::nccl;

namespace {

constexpr unsigned kConfigMagic = 0xcafebeef;
// Bytes of ncclConfig_t up to and including splitShare (the 2.17+ layout).
constexpr size_t kConfigMinSize = offsetof(ncclConfig_t, splitShare) + sizeof(int);

ncclResult_t readConfig(const ncclConfig_t* cfg, ncclCommImpl* c, const char* fn) {
  if (!cfg) return ncclSuccess;
  if (cfg->magic != kConfigMagic || cfg->size < kConfigMinSize)
    return fail(ncclInvalidArgument, std::string(fn) +
                                         ": config is not initialized (assign NCCL_CONFIG_INITIALIZER before "
                                         "setting fields)");
  if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (cfg->blocking != 0 && cfg->blocking != 1)
      return fail(ncclInvalidArgument, std::string(fn) + ": config.blocking must be 0 or 1, got " +
                                           std::to_string(cfg->blocking));
    c->blocking = cfg->blocking == 1;
  }
  if (cfg->netName) c->net_name = cfg->netName;
  return ncclSuccess;
}

int currentDevice() {
  const cuda::Api* a = cuda::api();
  int d = 0;
  if (a && a->getDevice(&d) != 0) {
    a->getLastError();
    d = 0;
  }
  return d;
}

void logReady(ncclCommImpl* c) {
  if (logLevel() < LogLevel::kInfo) return;
  std::string ts;
  for (int p = 0; p < c->nranks; ++p) {
    if (p == c->rank) continue;
    std::string t = c->comm->transportName(p);
    if (ts.find(t) == std::string::npos) ts += (ts.empty() ? "" : ",") + t;
  }
  HARP_INFO("nccl: communicator rank %d of %d ready on HARP %s, transport %s, cuda device %d", c->rank, c->nranks,
            HARP_VERSION_STRING, ts.empty() ? "self" : ts.c_str(), c->cuda_dev);
}

// Run `make` now, in the group, or in the background (nonblocking config).
ncclResult_t startCreate(ncclComm_t* out, ncclComm* c, std::function<std::shared_ptr<Communicator>()> make,
                         const char* fn) {
  auto body = [c, make] {
    try {
      c->comm = make();
      logReady(c);
      c->init_state.store(ncclSuccess);
    } catch (const std::exception& e) {
      ncclResult_t r = resultOf(e);
      c->setAsyncError(r, e.what());
      c->init_state.store(r);
    }
  };
  if (inGroup() || !c->blocking) {
    c->init_state.store(ncclInProgress);
    *out = c;
    if (inGroup()) {
      deferToGroupEnd([c, body] {
        body();
        if (c->init_state.load() != ncclSuccess) setLastError(c->error_text);
        return c->init_state.load();
      });
      return ncclSuccess;
    }
    c->init_thread = std::thread(body);
    return ncclInProgress;
  }
  body();
  if (c->init_state.load() != ncclSuccess) {
    ncclResult_t r = static_cast<ncclResult_t>(c->init_state.load());
    std::string text = std::string(fn) + ": " + c->error_text;
    delete c;
    *out = nullptr;
    return fail(r, text);
  }
  *out = c;
  return ncclSuccess;
}

ncclResult_t initRank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* cfg,
                      const char* fn) {
  if (!out) return fail(ncclInvalidArgument, std::string(fn) + ": comm (the output pointer) is NULL");
  *out = nullptr;
  if (nranks < 1)
    return fail(ncclInvalidArgument, std::string(fn) + ": nranks must be >= 1, got " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, std::string(fn) + ": rank " + std::to_string(rank) +
                                         " is out of range for nranks " + std::to_string(nranks));
  UniqueId uid;
  try {
    uid = UniqueId::fromBytes(id.internal, sizeof id.internal);
  } catch (const std::exception& e) {
    return fail(ncclInvalidArgument, std::string(fn) + ": " + e.what() + " (the id must come from ncclGetUniqueId)");
  }
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  c->cuda_dev = currentDevice();
  if (ncclResult_t r = readConfig(cfg, c, fn); r != ncclSuccess) {
    delete c;
    return r;
  }
  CommOptions o;
  o.transport = c->net_name;
  return startCreate(out, c, [uid, rank, nranks, o] { return Communicator::create(uid, rank, nranks, o); }, fn);
}

void waitInactive(ncclCommImpl* c, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while ((c->active.load() > 0 || c->outstanding.load() > 0) && std::chrono::steady_clock::now() < end)
    usleep(1000);
}

// Shared tail of destroy and abort.
void release(ncclCommImpl* c, bool aborting) {
  if (inheritedAcrossFork(c->made_in)) {
    // A forked child's copy: its threads are the parent's (a join crashes) and its connections
    // too. Forgotten, never freed; the core's communicator inside lets go the same way.
    c->magic = 0;
    return;
  }
  if (c->init_thread.joinable()) c->init_thread.join();
  if (!aborting) c->engine.drain();
  waitInactive(c, aborting ? 10.0 : (c->comm ? c->comm->timeout() : 60.0));
  c->engine.stop();
  bool quiet = c->outstanding.load() == 0;
  if (c->comm) c->comm->destroy();
  if (quiet) c->freePools();  // else CUDA may still copy from them: leak rather than corrupt
  c->magic = 0;
  delete static_cast<ncclComm*>(c);
}

std::mutex g_mem_mu;
std::set<void*>& hostAllocs() {
  static auto* s = new std::set<void*>();
  return *s;
}

}  // namespace

// ---------------------------------------------------------------------------

HARP_NCCL_EXPORT ncclResult_t pncclGetVersion(int* version) {
  HARP_NCCL_ENTER();
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclGetVersion, (int* version))

HARP_NCCL_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* out) {
  HARP_NCCL_ENTER();
  if (!out) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  try {
    UniqueId id = createUniqueId();
    static_assert(sizeof(out->internal) == 128);
    std::memcpy(out->internal, id.bytes.data(), 128);
    return ncclSuccess;
  } catch (const std::exception& e) {
    return fail(resultOf(e), std::string("ncclGetUniqueId: ") + e.what());
  }
}
HARP_NCCL_ALIAS(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * out))

HARP_NCCL_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  HARP_NCCL_ENTER();
  return initRank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))

HARP_NCCL_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                      ncclConfig_t* config) {
  HARP_NCCL_ENTER();
  return initRank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommInitRankConfig,
                (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config))

HARP_NCCL_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  HARP_NCCL_ENTER();
  if (!comms) return fail(ncclInvalidArgument, "ncclCommInitAll: comm (the output array) is NULL");
  if (ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: ndev must be >= 1, got " + std::to_string(ndev));
  for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
  UniqueId uid;
  try {
    uid = createUniqueId("127.0.0.1");
  } catch (const std::exception& e) {
    return fail(resultOf(e), std::string("ncclCommInitAll: ") + e.what());
  }
  std::vector<ncclComm*> cs(ndev);
  std::vector<std::thread> ts;
  for (int i = 0; i < ndev; ++i) {
    cs[i] = new ncclComm;
    cs[i]->rank = i;
    cs[i]->nranks = ndev;
    cs[i]->cuda_dev = devlist ? devlist[i] : i;
    ts.emplace_back([c = cs[i], uid, i, ndev] {
      try {
        c->comm = Communicator::create(uid, i, ndev);
        logReady(c);
      } catch (const std::exception& e) {
        c->setAsyncError(resultOf(e), e.what());
        c->init_state.store(resultOf(e));
      }
    });
  }
  for (auto& t : ts) t.join();
  ncclResult_t r = ncclSuccess;
  std::string text;
  for (auto* c : cs)
    if (c->init_state.load() != ncclSuccess && r == ncclSuccess) {
      r = static_cast<ncclResult_t>(c->init_state.load());
      text = "ncclCommInitAll: rank " + std::to_string(c->rank) + ": " + c->error_text;
    }
  if (r != ncclSuccess) {
    for (auto* c : cs) release(c, true);
    return fail(r, text);
  }
  for (int i = 0; i < ndev; ++i) comms[i] = cs[i];
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommInitAll, (ncclComm_t * comms, int ndev, const int* devlist))

HARP_NCCL_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                             ncclConfig_t* config) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommSplit: comm is NULL or not a HARP communicator");
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, "ncclCommSplit: color must be >= 0 or NCCL_SPLIT_NOCOLOR, got " +
                                         std::to_string(color));
  *newcomm = nullptr;
  if (ncclResult_t r = ensureReady(c); r != ncclSuccess) return r;
  c->engine.drain();
  auto parent = c->comm;
  if (color == NCCL_SPLIT_NOCOLOR) {
    // This rank takes part in the exchange but gets no communicator.
    auto body = [parent, key]() -> int {
      try {
        parent->split(-1, key);
        return ncclSuccess;
      } catch (const std::exception& e) {
        setLastError(e.what());
        return resultOf(e);
      }
    };
    if (inGroup()) {
      deferToGroupEnd(body);
      return ncclSuccess;
    }
    try {
      parent->split(-1, key);
    } catch (const std::exception& e) {
      return fail(resultOf(e), std::string("ncclCommSplit: ") + e.what());
    }
    return ncclSuccess;
  }
  auto* n = new ncclComm;
  n->cuda_dev = c->cuda_dev;
  n->blocking = c->blocking;
  n->net_name = c->net_name;
  if (ncclResult_t r = readConfig(config, n, "ncclCommSplit"); r != ncclSuccess) {
    delete n;
    return r;
  }
  // Rank and size of the new communicator are known only after the exchange.
  auto make = [parent, n, color, key]() -> std::shared_ptr<Communicator> {
    auto nc = parent->split(color, key);
    n->rank = nc->rank();
    n->nranks = nc->size();
    return nc;
  };
  return startCreate(newcomm, n, make, "ncclCommSplit");
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommSplit,
                (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config))

HARP_NCCL_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL or not a HARP communicator");
  if (ncclResult_t r = refuseInherited(c, "ncclCommFinalize"); r != ncclSuccess) return r;
  if (ncclResult_t r = ensureReady(c); r != ncclSuccess) return r;
  c->engine.drain();
  waitInactive(c, c->comm ? c->comm->timeout() : 60.0);
  ncclResult_t r = static_cast<ncclResult_t>(c->async_error.load());
  return r == ncclSuccess ? r : fail(r, "ncclCommFinalize: " + c->error_text);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))

HARP_NCCL_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  HARP_NCCL_ENTER();
  if (!comm) return ncclSuccess;  // as NCCL: destroying NULL is a no-op
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommDestroy: not a HARP communicator (already destroyed?)");
  try {
    release(c, false);
  } catch (const std::exception& e) {
    return failFrom(e);
  }
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))

HARP_NCCL_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  HARP_NCCL_ENTER();
  if (!comm) return ncclSuccess;
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommAbort: not a HARP communicator (already destroyed?)");
  if (ncclResult_t r = refuseInherited(c, "ncclCommAbort"); r != ncclSuccess) return r;
  try {
    if (c->comm) c->comm->abort("ncclCommAbort called on rank " + std::to_string(c->rank));
    release(c, true);
  } catch (const std::exception& e) {
    return failFrom(e);
  }
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommAbort, (ncclComm_t comm))

HARP_NCCL_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm is NULL or not a HARP communicator");
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  int init = c->init_state.load();
  if (init == ncclInProgress && c->init_thread.joinable()) {
    // Nonblocking creation: report progress without waiting.
    *asyncError = ncclInProgress;
    return ncclSuccess;
  }
  if (c->init_thread.joinable()) c->init_thread.join();
  if (init != ncclSuccess) {
    *asyncError = static_cast<ncclResult_t>(init);
    return ncclSuccess;
  }
  if (c->async_error.load() == ncclSuccess && c->comm && c->comm->broken()) {
    std::string why = c->comm->brokenReason();
    c->setAsyncError(why.find("mismatch") != std::string::npos ? ncclInvalidUsage : ncclRemoteError, why);
  }
  *asyncError = static_cast<ncclResult_t>(c->async_error.load());
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError))

HARP_NCCL_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  HARP_NCCL_ENTER();
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with HARP_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with HARP_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the HARP developers";
    case ncclInvalidArgument: return "invalid argument (run with HARP_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with HARP_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
HARP_NCCL_ALIAS(const char*, ncclGetErrorString, (ncclResult_t result))

HARP_NCCL_EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  HARP_NCCL_ENTER();
  const std::string& t = lastError();
  if (!t.empty()) return t.c_str();
  static thread_local std::string copy;
  if (ncclCommImpl* c = impl(comm)) {
    std::lock_guard<std::mutex> g(c->err_mu);
    copy = c->error_text;
    return copy.c_str();
  }
  return "";
}
HARP_NCCL_ALIAS(const char*, ncclGetLastError, (ncclComm_t comm))

HARP_NCCL_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommCount: comm is NULL or not a HARP communicator");
  if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  if (ncclResult_t r = ensureReady(c); r != ncclSuccess) return r;
  *count = c->nranks;
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count))

HARP_NCCL_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommCuDevice: comm is NULL or not a HARP communicator");
  if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = c->cuda_dev;
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device))

HARP_NCCL_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommUserRank: comm is NULL or not a HARP communicator");
  if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  if (ncclResult_t r = ensureReady(c); r != ncclSuccess) return r;
  *rank = c->rank;
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank))

HARP_NCCL_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  HARP_NCCL_ENTER();
  if (!impl(comm)) return fail(ncclInvalidArgument, "ncclCommRegister: comm is NULL or not a HARP communicator");
  if (!handle) return fail(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  // HARP stages through its own pinned buffers; registration is a no-op with a real handle.
  *handle = new std::pair<void*, size_t>(buff, size);
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle))

HARP_NCCL_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  HARP_NCCL_ENTER();
  if (!impl(comm)) return fail(ncclInvalidArgument, "ncclCommDeregister: comm is NULL or not a HARP communicator");
  if (!handle) return fail(ncclInvalidArgument, "ncclCommDeregister: handle is NULL");
  delete static_cast<std::pair<void*, size_t>*>(handle);
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))

HARP_NCCL_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  HARP_NCCL_ENTER();
  if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  if (const cuda::Api* a = cuda::api()) {
    try {
      cuda::check(a->malloc(ptr, size), "ncclMemAlloc: cudaMalloc");
      return ncclSuccess;
    } catch (const std::exception& e) {
      return failFrom(e);
    }
  }
  if (posix_memalign(ptr, 4096, size) != 0)
    return fail(ncclSystemError, "ncclMemAlloc: out of host memory for " + std::to_string(size) + " bytes");
  std::lock_guard<std::mutex> g(g_mem_mu);
  hostAllocs().insert(*ptr);
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size))

HARP_NCCL_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  HARP_NCCL_ENTER();
  if (!ptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> g(g_mem_mu);
    auto it = hostAllocs().find(ptr);
    if (it != hostAllocs().end()) {
      hostAllocs().erase(it);
      std::free(ptr);
      return ncclSuccess;
    }
  }
  if (const cuda::Api* a = cuda::api()) {
    try {
      cuda::check(a->free(ptr), "ncclMemFree: cudaFree");
      return ncclSuccess;
    } catch (const std::exception& e) {
      return failFrom(e);
    }
  }
  return fail(ncclInvalidArgument, "ncclMemFree: pointer was not allocated by ncclMemAlloc");
}
HARP_NCCL_ALIAS(ncclResult_t, ncclMemFree, (void* ptr))

HARP_NCCL_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                        ncclScalarResidence_t residence, ncclComm_t comm) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: comm is NULL or not a HARP communicator");
  if (!op || !scalar) return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op or scalar is NULL");
  size_t es;
  try {
    es = ncclTypeSize(datatype);
  } catch (const std::exception& e) {
    return fail(ncclInvalidArgument, std::string("ncclRedOpCreatePreMulSum: ") + e.what());
  }
  if (residence != ncclScalarHostImmediate && residence != ncclScalarDevice)
    return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: residence " + std::to_string(residence) +
                                         " must be ncclScalarDevice (0) or ncclScalarHostImmediate (1)");
  RedOpEntry e;
  e.live = true;
  e.dtype = datatype;
  e.immediate = residence == ncclScalarHostImmediate;
  e.ptr = scalar;
  if (e.immediate) {
    std::memcpy(e.value, scalar, es);
  } else if (!cuda::isDevice(scalar)) {
    // A "device" scalar in host memory (no CUDA here): read at run time all the same.
  }
  size_t i = 0;
  while (i < c->redops.size() && c->redops[i].live) ++i;
  if (i == c->redops.size()) c->redops.push_back(e);
  else c->redops[i] = e;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + i);
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclRedOpCreatePreMulSum,
                (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,
                 ncclComm_t comm))

HARP_NCCL_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclRedOpDestroy: comm is NULL or not a HARP communicator");
  int i = static_cast<int>(op) - ncclNumOps;
  if (static_cast<int>(op) < ncclNumOps)
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: op " + std::to_string(static_cast<int>(op)) +
                                         " is a built-in operator, not one made by ncclRedOpCreatePreMulSum");
  if (i >= static_cast<int>(c->redops.size()) || !c->redops[i].live)
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: op " + std::to_string(static_cast<int>(op)) +
                                         " was not created on this communicator (or is already destroyed)");
  c->redops[i].live = false;
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))

// Fault tolerance: communicator creation for nccl_ft.cc (shrink, grow).
namespace harp::nccl {
ncclResult_t createDerived(ncclComm_t* out, ncclComm* c, std::function<std::shared_ptr<Communicator>()> make,
                           const ncclConfig_t* cfg, const char* fn, bool fresh) {
  if (fresh) c->cuda_dev = currentDevice();
  if (ncclResult_t r = readConfig(cfg, c, fn); r != ncclSuccess) {
    delete c;
    return r;
  }
  return startCreate(out, c, std::move(make), fn);
}
}  // namespace harp::nccl
