// core/algorithms/group.h — a sub-communicator as a hierarchical algorithm
// sees it: a Group of ranks it can run ordinary collectives on (its legs).
//
// Usage (core/algorithms/allreduce_leader.cc):
//
//   SubComms& s = ctx.subComms();              // core/topology/topology.h
//   if (s.intra) runOn(*s.intra, CollType::kReduce, in, out, n, dt, op, 0, ctx.timeout());
//   if (s.rail) auto w = s.rail->submit(args, /*async=*/true);   // overlapped leg
//
// The engine's Communicator (core/engine/communicator.h) is the one
// implementation; algorithms see only this interface, so the algorithm layer
// does not depend on the engine that runs it. A leg costs a whole call
// (validation, selection, a Context, the closing check): core/algorithms/hier.h
// kLegCallS.
//
// Lifetime: a Group is owned by the parent communicator (made at its first
// hierarchical call, destroyed with it). Threading: as a Communicator's: one
// submitting thread at a time; abort() from any thread.
#pragma once

#include <memory>
#include <string>

#include "base/types.h"
#include "core/engine/call.h"

namespace harp {

class Group {
 public:
  virtual ~Group() = default;
  virtual int size() const = 0;
  // One collective; blocking (run: errors thrown here) or as a Work
  // (submit(async=true) runs it on the group's worker thread).
  virtual void run(CollArgs args) = 0;
  virtual std::shared_ptr<Work> submit(CollArgs args, bool async) = 0;
  // Breaks the group on every rank (peers raise instead of waiting).
  virtual void abort(const std::string& reason) = 0;
  virtual bool broken() const = 0;  // a failure or abort() broke it: every call raises
  virtual void destroy() = 0;
};

// One blocking collective on a group with the parent's timeout (its errors
// propagate). `recv` may equal `send`.
inline void runOn(Group& g, CollType coll, const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                  int root, double timeout_s, int link_flows = 1) {
  CollArgs a;
  a.coll = coll;
  a.sendbuf = send;
  a.recvbuf = recv;
  a.count = count;
  a.dtype = dt;
  a.op = op;
  a.root = root;
  a.opts.timeout_s = timeout_s;
  a.opts.link_flows = link_flows;
  g.run(std::move(a));
}

}  // namespace harp
