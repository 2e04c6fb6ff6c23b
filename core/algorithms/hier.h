// core/algorithms/hier.h — what the hierarchical algorithms (allreduce_rail.cc,
// allreduce_leader.cc, ...) share: the per-leg call overhead of the cost model
// and the reduction op their legs run.
//
// A leg is one blocking collective on a sub-communicator (core/topology/topology.h
// runOn): it costs a call (validation, the selector's memo, a Context, the
// closing check), kLegCallS in the cost functions, on top of its own
// alpha-beta-gamma cost. Avg is computed as a sum by every algorithm (the
// parent divides once at the end, in the call pipeline), so the legs sum.
#pragma once

#include "core/algorithms/algorithm.h"
#include "core/algorithms/group.h"
#include "base/types.h"

namespace harp::hier {

// Seconds one leg's call costs beyond its messages (measured: 2 ranks, shm,
// 8-byte allreduce called through Communicator::run ~ 1.5-3 us on the
// development VM; 3 us keeps the model from preferring three legs to one
// flat call where they tie).
constexpr double kLegCallS = 3e-6;

inline ReduceOp legOp(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

}  // namespace harp::hier
