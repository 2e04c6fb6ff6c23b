// core/engine/pipeline.h — one collective call, as five stages.
//
//   validate  Communicator::validate (core/engine/validate.cc), on the caller's
//             thread when the call is submitted: arguments alone, nothing sent,
//             so an InvalidArgument leaves the communicator usable. When the
//             call runs, runCollective refuses a broken communicator with the
//             error that broke it, and sends integer avg through runIntAvg
//             (widened data, the caller's dtype in the descriptor).
//   choose    Communicator::choose: the algorithm. Hook: compression
//             (compressedAlgorithm, core/engine/communicator_compress.cc)
//             answers first for an allreduce that may compress; otherwise the
//             selector (core/select/select.h), memoised per collective by
//             byte count and in-place-ness (algorithmFor).
//   describe  Communicator::describe: the call's sequence number, Descriptor
//             and message tag (core/engine/context.h, makeTag), and whether the
//             exact descriptor check runs (rooted calls, zero counts, tags that
//             cannot carry the descriptor). p2p calls take no sequence number.
//   run       Communicator::runPlan: a Context over the communicator's
//             resources, the descriptor check (before the algorithm where the
//             tag cannot do it, else alongside), the algorithm, the earlier
//             calls' deferred checks, the closing abort-notice check. Hooks:
//             the recorder (obs::OpScope, core/observe/recorder.h) opens before
//             this stage and is marked ok at its end, while the Context still
//             lives; fault tolerance (failCall) takes every failure but an
//             argument error: it breaks the communicator on every rank
//             (markBroken) and rewrites the error (an earlier deferred
//             finding, the op-count view of a timeout, a revocation, the
//             keep-alive's dead ranks).
//   finish    Communicator::finish: scratch trimmed to its cap, avg divided.
//
// Usage: runCollective(args) is the one entry (submit/run/the worker call it
// under exec_mu_); the stages are private members of Communicator, called in
// order by runStages with one CallPlan on its stack.
//
// Lifetime: a CallPlan lives for one runStages call and refers to the caller's
// CollArgs. Threading: the executing thread only (under exec_mu_).
//
// Cost: choose, describe, run and finish are inline in pipeline.cc (no call
// through the PLT); a call makes no allocation, std::function or virtual
// dispatch of its own (the algorithm is one function pointer, as before).
// Keep the CallPlan's address from escaping (pass copies of its fields to
// out-of-line calls), or the compiler keeps it in memory: +23 instructions a
// call. Instructions and CPU time per call against the single function it
// replaced: bench/RESULTS.md ("Call pipeline").
#pragma once

#include <cstdint>

#include "base/types.h"
#include "core/engine/call.h"

namespace harp {

struct Algorithm;  // core/algorithms/algorithm.h

// What the stages know about one call, filled in stage order.
struct CallPlan {
  CallPlan(CollArgs& a, DataType dt, double t) : args(a), user_dtype(dt), timeout(t) {}
  CollArgs& args;          // as it runs (runIntAvg: the widened copy)
  DataType user_dtype;     // the caller's dtype: the tag and descriptor name it
  double timeout;          // the call's own timeout, else the communicator's
  // choose
  const Algorithm* algo = nullptr;
  // describe
  bool p2p = false;        // send, recv, p2p_batch: a user tag, no sequence number
  bool rooted = false;
  bool check = false;      // the exact descriptor check runs (Context::startCheck)
  Descriptor desc;         // seq is 0 for p2p
  uint64_t tag = 0;
};

}  // namespace harp
