// bindings/nccl/nccl_coll.cc — NCCL API: collectives, send/recv and groups.
//
// Each call becomes an Op. Outside a group an Op runs at once; inside
// ncclGroupStart/End the Ops are kept (per thread) and at the outermost
// ncclGroupEnd each communicator's Ops become one Job: its collectives in call
// order, then all its sends and receives as one p2p batch (posted together,
// so alltoall-style exchanges progress). Consecutive allreduces of one dtype
// and op on disjoint buffers become one allreduce_coalesced (one ring
// schedule over their buffers, no packing copies; HARP_NCCL_GROUP_COALESCE).
// Jobs of several communicators (one thread driving several ranks) run
// concurrently.
//
// Buffers: host memory is used in place. Device memory (CUDA present) is
// staged: overlapping uses of one job share one pinned buffer (so NCCL's
// in-place forms stay in place); inputs are copied to it on the user's stream,
// the engine thread waits for that copy (an event), runs the collectives,
// and a host function on the stream holds the stream until they are done;
// outputs are copied back on the stream after it. The caller never blocks
// on the device path; the stream is held exactly as long as the collective.
//
// Threading: see nccl_internal.h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>

#include "bindings/nccl/nccl_export.h"
#include "bindings/nccl/nccl_internal.h"
#include "base/env.h"
#include "base/log.h"
#include "base/probe.h"

using namespace harp;
using namespace harp::nccl;

namespace {

struct Op {
  ncclCommImpl* c = nullptr;
  CollType coll = CollType::kAllreduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t dt = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  int peer = -1;
  cuda::Stream stream = nullptr;
  const char* name = "";
};

struct GroupState {
  int depth = 0;
  std::vector<Op> ops;
  std::vector<std::function<int()>> deferred;
  ncclResult_t error = ncclSuccess;
  std::string error_text;
};
thread_local GroupState t_group;


ReduceOp toOp(ncclRedOp_t op) {
  switch (static_cast<int>(op)) {
    case ncclSum: return ReduceOp::kSum;
    case ncclProd: return ReduceOp::kProd;
    case ncclMax: return ReduceOp::kMax;
    case ncclMin: return ReduceOp::kMin;
    case ncclAvg: return ReduceOp::kAvg;
  }
  return ReduceOp::kSum;  // PreMulSum: prescale, then sum
}

// Argument checks done at call time (also inside groups), so errors come back
// from the call that made them. The core checks the rest when it runs.
ncclResult_t check(const Op& o) {
  std::string fn = o.name;
  if (!o.c) return fail(ncclInvalidArgument, fn + ": comm is NULL or not a HARP communicator");
  if (ncclResult_t r = refuseInherited(o.c, fn.c_str()); r != ncclSuccess) return r;
  if (ncclResult_t r = ensureReady(o.c); r != ncclSuccess) return r;
  if (o.c->async_error.load() != ncclSuccess) {
    std::lock_guard<std::mutex> g(o.c->err_mu);
    return fail(static_cast<ncclResult_t>(o.c->async_error.load()),
                fn + ": communicator has failed earlier: " + o.c->error_text);
  }
  try {
    toDtype(o.dt);
  } catch (const std::exception& e) {
    return fail(ncclInvalidArgument, fn + ": " + e.what());
  }
  if (collReduces(o.coll)) {
    int op = static_cast<int>(o.op);
    if (op < 0) return fail(ncclInvalidArgument, fn + ": invalid ncclRedOp_t " + std::to_string(op));
    if (op >= ncclNumOps) {
      size_t i = op - ncclNumOps;
      if (i >= o.c->redops.size() || !o.c->redops[i].live)
        return fail(ncclInvalidArgument, fn + ": ncclRedOp_t " + std::to_string(op) +
                                             " is neither built in nor created on this communicator");
      if (o.c->redops[i].dtype != o.dt)
        return fail(ncclInvalidArgument, fn + ": PreMulSum operator " + std::to_string(op) +
                                             " was created for another datatype");
    }
  }
  if (collRooted(o.coll) && (o.root < 0 || o.root >= o.c->nranks))
    return fail(ncclInvalidArgument, fn + ": root " + std::to_string(o.root) + " is out of range for " +
                                         std::to_string(o.c->nranks) + " ranks");
  bool p2p = o.coll == CollType::kSend || o.coll == CollType::kRecv;
  if (p2p && (o.peer < 0 || o.peer >= o.c->nranks))
    return fail(ncclInvalidArgument, fn + ": peer " + std::to_string(o.peer) + " is out of range for " +
                                         std::to_string(o.c->nranks) + " ranks");
  if (p2p && o.peer == o.c->rank && t_group.depth == 0)
    return fail(ncclInvalidUsage, fn + ": send/recv to this rank itself needs ncclGroupStart/ncclGroupEnd around "
                                       "the matching pair");
  // The buffers' sizes are the caller's, as in NCCL (a pointer carries none): each must hold
  // count x ncclTypeSize(datatype) bytes, times nranks for all-gather's receive and
  // reduce-scatter's send buffer. What can be checked is that this size is representable.
  const size_t es = ncclTypeSize(o.dt), span = static_cast<size_t>(std::max(o.c->nranks, 1));
  if (es && o.count > SIZE_MAX / es / span)
    return fail(ncclInvalidArgument, fn + ": count " + std::to_string(o.count) + " x " + std::to_string(es) +
                                         " bytes overflows the address space");
  if (o.count > 0) {
    // The buffers this rank's part uses (vocab.def's byte rule; NCCL's broadcast root passes both).
    const bool at_root = o.root == o.c->rank;
    bool needs_send = bufferBlocks(collSend(o.coll), 1, at_root) > 0;
    bool needs_recv = bufferBlocks(collRecv(o.coll), 1, at_root) > 0;
    if (needs_send && !o.send) return fail(ncclInvalidArgument, fn + ": send buffer is NULL");
    if (needs_recv && !o.recv) return fail(ncclInvalidArgument, fn + ": receive buffer is NULL");
  }
  return ncclSuccess;
}

// A buffer use: [ptr, ptr+bytes), read and/or written by the job.
struct Use {
  const char* ptr;
  size_t bytes;
  bool in, out;
};

void usesOf(const Op& o, std::vector<Use>& u) {
  const size_t es = ncclTypeSize(o.dt), n = o.count * es, p = o.c->nranks;
  const bool at_root = o.root == o.c->rank;
  auto add = [&](const void* ptr, size_t bytes, bool in, bool out) {
    if (ptr && bytes) u.push_back({static_cast<const char*>(ptr), bytes, in, out});
  };
  // vocab.def's byte rule: each buffer's blocks of `count` on this rank (0 where unused).
  add(o.send, n * bufferBlocks(collSend(o.coll), p, at_root), true, false);
  add(o.recv, n * bufferBlocks(collRecv(o.coll), p, at_root), false, true);
}

// Memory safety: host buffers the kernel says are unmapped (or read-only
// where the call writes) are refused here, naming the buffer; the shm
// transport and the reduce kernels would fault on them (base/probe.h).
ncclResult_t probeHostBuffers(const Op& o) {
  std::vector<Use> uses;
  usesOf(o, uses);
  for (const Use& u : uses) {
    if (cuda::api() && cuda::isDevice(u.ptr)) continue;
    std::string bad = probeRange(u.ptr, u.bytes, u.out);
    if (!bad.empty())
      return fail(ncclInvalidArgument, std::string(o.name) + ": bad local " + (u.out ? "receive" : "send") +
                                           " buffer on rank " + std::to_string(o.c->rank) + ": " + bad);
  }
  return ncclSuccess;
}

// Maps user device addresses to their pinned stand-ins.
struct StageMap {
  std::vector<Staging>* regions;
  void* tr(const void* p) const {
    if (!p) return nullptr;
    const char* q = static_cast<const char*>(p);
    for (auto& r : *regions) {
      const char* d = static_cast<const char*>(r.dev);
      if (q >= d && q < d + r.bytes) return static_cast<char*>(r.host) + (q - d);
    }
    return const_cast<void*>(p);
  }
};

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

// Whether allreduce `a` may join the run of allreduces `run` in one coalesced
// schedule: same dtype and op, no integer avg, and no buffer of `a` touching
// a buffer of the run (a later allreduce may read an earlier one's result:
// then they stay in order, as separate calls).
bool joins(const std::vector<CollArgs>& run, const CollArgs& a) {
  if (a.count == 0) return false;
  if (a.op == ReduceOp::kAvg && isInteger(a.dtype)) return false;  // validate() refuses it in a list
  if (run.empty()) return true;
  if (a.dtype != run[0].dtype || a.op != run[0].op) return false;
  const size_t n = a.count * dtypeSize(a.dtype);
  for (const CollArgs& b : run) {
    const size_t m = b.count * dtypeSize(b.dtype);
    if (overlaps(a.recvbuf, n, b.recvbuf, m) || overlaps(a.recvbuf, n, b.sendbuf, m) ||
        overlaps(a.sendbuf, n, b.recvbuf, m))
      return false;
  }
  return true;
}

// Runs of two or more joinable allreduces become one allreduce_coalesced.
void coalesceAllreduces(std::vector<CollArgs>& colls) {
  std::vector<CollArgs> out, run;
  auto flush = [&] {
    if (run.size() == 1) out.push_back(std::move(run[0]));
    if (run.size() > 1) {
      CollArgs c;
      c.coll = CollType::kAllreduceCoalesced;
      c.dtype = run[0].dtype;
      c.op = run[0].op;
      for (const CollArgs& a : run) {
        c.pieces.push_back({a.sendbuf, a.recvbuf, a.count});
        c.count += a.count;
      }
      out.push_back(std::move(c));
    }
    run.clear();
  };
  for (CollArgs& a : colls) {
    if (a.coll == CollType::kAllreduce && joins(run, a)) {
      run.push_back(std::move(a));
      continue;
    }
    flush();
    if (a.coll == CollType::kAllreduce && joins(run, a)) run.push_back(std::move(a));
    else out.push_back(std::move(a));
  }
  flush();
  colls = std::move(out);
}

// Build one communicator's job from its ops (collectives in order, p2p batched last).
std::shared_ptr<Job> buildJob(ncclCommImpl* c, const std::vector<Op>& ops, bool* device) {
  auto j = std::make_shared<Job>();
  j->comm = c;
  // 1. Which buffers are device memory: merge overlapping device uses into regions.
  std::vector<Use> uses;
  for (auto& o : ops) usesOf(o, uses);
  std::vector<Use> dev;
  if (cuda::api())
    for (auto& u : uses)
      if (cuda::isDevice(u.ptr)) dev.push_back(u);
  *device = !dev.empty();
  if (*device) {
    std::sort(dev.begin(), dev.end(), [](const Use& a, const Use& b) { return a.ptr < b.ptr; });
    for (auto& u : dev) {
      if (!j->staging.empty()) {
        Staging& last = j->staging.back();
        const char* end = static_cast<const char*>(last.dev) + last.bytes;
        if (u.ptr < end) {  // overlaps (never merge separate allocations that merely touch)
          const char* uend = u.ptr + u.bytes;
          if (uend > end) last.bytes = uend - static_cast<const char*>(last.dev);
          last.copy_in |= u.in;
          last.copy_out |= u.out;
          continue;
        }
      }
      Staging s;
      s.dev = const_cast<char*>(u.ptr);
      s.bytes = u.bytes;
      s.copy_in = u.in;
      s.copy_out = u.out;
      j->staging.push_back(s);
    }
    // Regions written only in part must be read first so the rest survives.
    for (auto& s : j->staging) {
      size_t written = 0;
      for (auto& u : dev)
        if (u.out && u.ptr >= s.dev && u.ptr < static_cast<char*>(s.dev) + s.bytes) written += u.bytes;
      if (written < s.bytes) s.copy_in = true;
      s.host = c->acquirePinned(s.bytes, &s.cap);
    }
  }
  StageMap m{&j->staging};
  // 2. The core's arguments.
  CollArgs batch;
  batch.coll = CollType::kP2pBatch;
  batch.dtype = DataType::kUint8;
  for (auto& o : ops) {
    const size_t es = ncclTypeSize(o.dt);
    if (o.coll == CollType::kSend || o.coll == CollType::kRecv) {
      P2pOp p;
      p.send = o.coll == CollType::kSend;
      p.peer = o.peer;
      p.buf = p.send ? m.tr(o.send) : m.tr(o.recv);
      p.count = o.count * es;
      batch.p2p.push_back(p);
      continue;
    }
    CollArgs a;
    a.coll = o.coll;
    a.sendbuf = m.tr(o.send);
    a.recvbuf = m.tr(o.recv);
    a.count = o.count;
    a.dtype = toDtype(o.dt);
    a.op = toOp(o.op);
    a.root = o.root;
    // A buffer the byte rule leaves unused on this rank (broadcast's send, reduce's receive off the root).
    if (!bufferBlocks(collSend(o.coll), 1, o.root == c->rank)) a.sendbuf = nullptr;
    if (!bufferBlocks(collRecv(o.coll), 1, o.root == c->rank)) a.recvbuf = nullptr;
    if (collReduces(o.coll) && static_cast<int>(o.op) >= ncclNumOps) {
      size_t n = o.count * bufferBlocks(collSend(o.coll), c->nranks, true);  // the send buffer's elements
      j->temps.emplace_back(new char[std::max<size_t>(n * es, 1)]);
      Prescale ps{a.sendbuf, j->temps.back().get(), n, o.dt, c->redops[o.op - ncclNumOps]};
      j->prescale.push_back(ps);
      a.sendbuf = j->temps.back().get();
    }
    j->colls.push_back(std::move(a));
  }
  if (j->colls.size() > 1 && env::flag("HARP_NCCL_GROUP_COALESCE")) coalesceAllreduces(j->colls);
  if (!batch.p2p.empty()) j->colls.push_back(std::move(batch));
  return j;
}

// CUDA host functions (run on CUDA's callback thread; no CUDA calls allowed).
void hostWait(void* p) {
  auto* holder = static_cast<std::shared_ptr<Job>*>(p);
  (*holder)->waitDone();
  delete holder;
}
void hostRelease(void* p) {
  auto* holder = static_cast<std::shared_ptr<Job>*>(p);
  Job& j = **holder;
  for (auto& s : j.staging) j.comm->releasePinned(s.host, s.cap);
  if (j.ready) j.comm->releaseEvent(j.ready);
  j.comm->outstanding.fetch_sub(1);
  delete holder;
}

// Device path: enqueue copies, the job and its completion on the streams.
void launchDevice(const std::shared_ptr<Job>& j, const std::vector<cuda::Stream>& streams) {
  const cuda::Api* a = cuda::api();
  ncclCommImpl* c = j->comm;
  cuda::Stream s = streams[0];
  if (a->streamIsCapturing)
    for (auto st : streams) {
      int capturing = 0;
      if (a->streamIsCapturing(st, &capturing) == 0 && capturing != 0) {
        for (auto& stg : j->staging) c->releasePinned(stg.host, stg.cap);
        throw Error(Error::kInvalidArgument,
                    "HARP cannot run NCCL calls inside CUDA graph capture (stream is capturing); "
                    "call them outside the captured region");
      }
    }
  j->stream = s;
  j->ready = c->acquireEvent();
  for (size_t i = 1; i < streams.size(); ++i) {  // other streams of the group: s waits for them
    cuda::Event e = c->acquireEvent();
    cuda::check(a->eventRecord(e, streams[i]), "cudaEventRecord");
    cuda::check(a->streamWaitEvent(s, e, 0), "cudaStreamWaitEvent");
    c->releaseEvent(e);
  }
  for (auto& st : j->staging)
    if (st.copy_in)
      cuda::check(a->memcpyAsync(st.host, st.dev, st.bytes, cuda::kMemcpyDefault, s), "cudaMemcpyAsync (to host)");
  cuda::check(a->eventRecord(j->ready, s), "cudaEventRecord");
  c->outstanding.fetch_add(1);
  c->engine.enqueue(j);
  cuda::check(a->launchHostFunc(s, hostWait, new std::shared_ptr<Job>(j)), "cudaLaunchHostFunc");
  for (auto& st : j->staging)
    if (st.copy_out)
      cuda::check(a->memcpyAsync(st.dev, st.host, st.bytes, cuda::kMemcpyDefault, s), "cudaMemcpyAsync (to device)");
  cuda::check(a->launchHostFunc(s, hostRelease, new std::shared_ptr<Job>(j)), "cudaLaunchHostFunc");
  for (size_t i = 1; i < streams.size(); ++i) {  // and they wait for s
    cuda::Event e = c->acquireEvent();
    cuda::check(a->eventRecord(e, s), "cudaEventRecord");
    cuda::check(a->streamWaitEvent(streams[i], e, 0), "cudaStreamWaitEvent");
    c->releaseEvent(e);
  }
}

// Host path prelude: the stream's earlier work may write our host buffers.
void syncStreams(const std::vector<cuda::Stream>& streams) {
  const cuda::Api* a = cuda::api();
  if (!a) return;
  for (auto s : streams)
    if (s) cuda::check(a->streamSynchronize(s), "cudaStreamSynchronize");
}

// Run the ops of one or more communicators (one group, or one call).
ncclResult_t runOps(const std::vector<Op>& ops) {
  // Per communicator, in order of first appearance; collectives before p2p.
  std::vector<ncclCommImpl*> comms;
  std::map<ncclCommImpl*, std::vector<Op>> by;
  std::map<ncclCommImpl*, std::vector<cuda::Stream>> streams;
  for (auto& o : ops) {
    if (!by.count(o.c)) comms.push_back(o.c);
    by[o.c];
    auto& ss = streams[o.c];
    if (std::find(ss.begin(), ss.end(), o.stream) == ss.end()) ss.push_back(o.stream);
  }
  for (auto& o : ops)
    if (o.coll != CollType::kSend && o.coll != CollType::kRecv) by[o.c].push_back(o);
  for (auto& o : ops)
    if (o.coll == CollType::kSend || o.coll == CollType::kRecv) by[o.c].push_back(o);

  struct ActiveSet {
    std::vector<ncclCommImpl*> v;
    ~ActiveSet() { for (auto* c : v) c->active.fetch_sub(1); }
  } active;
  for (auto* c : comms) {
    c->active.fetch_add(1);
    active.v.push_back(c);
  }
  std::vector<std::shared_ptr<Job>> waits;
  ncclResult_t result = ncclSuccess;
  std::string text;
  for (auto* c : comms) {
    try {
      bool device = false;
      auto j = buildJob(c, by[c], &device);
      if (device) {
        launchDevice(j, streams[c]);
      } else {
        syncStreams(streams[c]);
        if (comms.size() == 1) {
          c->engine.drain();
          runJob(*j);
          if (j->result != ncclSuccess) return fail(j->result, j->error);
        } else {
          c->engine.enqueue(j);
          waits.push_back(j);
        }
      }
    } catch (const std::exception& e) {
      if (result == ncclSuccess) {
        result = resultOf(e);
        text = e.what();
      }
    }
  }
  for (auto& j : waits) {
    j->waitDone();
    if (j->result != ncclSuccess && result == ncclSuccess) {
      result = j->result;
      text = "rank " + std::to_string(j->comm->rank) + ": " + j->error;
    }
  }
  return result == ncclSuccess ? result : fail(result, text);
}

ncclResult_t submitOp(const Op& o) {
  ncclResult_t r = check(o);
  if (r == ncclSuccess) r = probeHostBuffers(o);
  if (r != ncclSuccess) {
    if (t_group.depth > 0 && t_group.error == ncclSuccess) {
      t_group.error = r;
      t_group.error_text = lastError();
    }
    return r;
  }
  if (t_group.depth > 0) {
    t_group.ops.push_back(o);
    return ncclSuccess;
  }
  return runOps({o});
}

Op makeOp(const char* name, CollType coll, ncclComm_t comm, const void* send, void* recv, size_t count,
          ncclDataType_t dt, cudaStream_t stream) {
  Op o;
  o.name = name;
  o.coll = coll;
  o.c = impl(comm);
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dt = dt;
  o.stream = stream;
  return o;
}

}  // namespace

namespace harp::nccl {

bool inGroup() { return t_group.depth > 0; }

void deferToGroupEnd(std::function<int()> fn) { t_group.deferred.push_back(std::move(fn)); }

ncclResult_t refuseInherited(ncclCommImpl* c, const char* fn) {
  if (!inheritedAcrossFork(c->made_in)) [[likely]]
    return ncclSuccess;
  return fail(ncclInvalidUsage, std::string(fn) + ": the communicator of rank " + std::to_string(c->rank) +
                                    " was created before this process was forked from its creator; a forked "
                                    "child cannot use it (create one in the child)");
}

ncclResult_t ensureReady(ncclCommImpl* c) {
  int s = c->init_state.load();
  if (s == ncclInProgress) {
    if (c->init_thread.joinable()) c->init_thread.join();
    s = c->init_state.load();
    if (s == ncclInProgress)
      return fail(ncclInvalidUsage, "communicator is still being created (call ncclGroupEnd first)");
  }
  if (s != ncclSuccess) {
    std::lock_guard<std::mutex> g(c->err_mu);
    return fail(static_cast<ncclResult_t>(s), "communicator creation failed: " + c->error_text);
  }
  return ncclSuccess;
}

}  // namespace harp::nccl

// ---------------------------------------------------------------------------

HARP_NCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream) {
  HARP_NCCL_ENTER();
  Op o = makeOp("ncclAllReduce", CollType::kAllreduce, comm, sendbuff, recvbuff, count, datatype, stream);
  o.op = op;
  return submitOp(o);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclAllReduce,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                 ncclComm_t comm, cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             cudaStream_t stream) {
  HARP_NCCL_ENTER();
  Op o = makeOp("ncclBroadcast", CollType::kBroadcast, comm, sendbuff, recvbuff, count, datatype, stream);
  o.root = root;
  return submitOp(o);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclBroadcast,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                 ncclComm_t comm, cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                         cudaStream_t stream) {
  HARP_NCCL_ENTER();
  Op o = makeOp("ncclBcast", CollType::kBroadcast, comm, buff, buff, count, datatype, stream);
  o.root = root;
  return submitOp(o);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclBcast,
                (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  HARP_NCCL_ENTER();
  Op o = makeOp("ncclReduce", CollType::kReduce, comm, sendbuff, recvbuff, count, datatype, stream);
  o.op = op;
  o.root = root;
  return submitOp(o);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclReduce,
                (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
                 ncclComm_t comm, cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                             ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  HARP_NCCL_ENTER();
  return submitOp(makeOp("ncclAllGather", CollType::kAllgather, comm, sendbuff, recvbuff, sendcount, datatype, stream));
}
HARP_NCCL_ALIAS(ncclResult_t, ncclAllGather,
                (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                 cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                 cudaStream_t stream) {
  HARP_NCCL_ENTER();
  Op o = makeOp("ncclReduceScatter", CollType::kReduceScatter, comm, sendbuff, recvbuff, recvcount, datatype, stream);
  o.op = op;
  return submitOp(o);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclReduceScatter,
                (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                 ncclComm_t comm, cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                        ncclComm_t comm, cudaStream_t stream) {
  HARP_NCCL_ENTER();
  Op o = makeOp("ncclSend", CollType::kSend, comm, sendbuff, nullptr, count, datatype, stream);
  o.peer = peer;
  return submitOp(o);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclSend,
                (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                 cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                        ncclComm_t comm, cudaStream_t stream) {
  HARP_NCCL_ENTER();
  Op o = makeOp("ncclRecv", CollType::kRecv, comm, nullptr, recvbuff, count, datatype, stream);
  o.peer = peer;
  return submitOp(o);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclRecv,
                (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                 cudaStream_t stream))

HARP_NCCL_EXPORT ncclResult_t pncclGroupStart(void) {
  HARP_NCCL_ENTER();
  ++t_group.depth;
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclGroupStart, (void))

HARP_NCCL_EXPORT ncclResult_t pncclGroupEnd(void) {
  HARP_NCCL_ENTER();
  if (t_group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  GroupState g = std::move(t_group);
  t_group = GroupState{};
  // Deferred creations/splits first, concurrently (one thread may create several ranks).
  std::vector<int> results(g.deferred.size(), ncclSuccess);
  if (g.deferred.size() == 1) {
    results[0] = g.deferred[0]();
  } else if (!g.deferred.empty()) {
    std::vector<std::thread> ts;
    for (size_t i = 0; i < g.deferred.size(); ++i) ts.emplace_back([&, i] { results[i] = g.deferred[i](); });
    for (auto& t : ts) t.join();
  }
  for (int r : results)
    if (r != ncclSuccess && g.error == ncclSuccess) {
      g.error = static_cast<ncclResult_t>(r);
      g.error_text = "communicator creation or split in the group failed: " + lastError();
    }
  if (g.error != ncclSuccess) return fail(g.error, "ncclGroupEnd: an operation of the group failed: " + g.error_text);
  if (g.ops.empty()) return ncclSuccess;
  return runOps(g.ops);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclGroupEnd, (void))
