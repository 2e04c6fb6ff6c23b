// core/algorithms/hier.h — what the hierarchical algorithms (allreduce_rail.cc,
// allreduce_leader.cc, ...) share: the per-leg call overhead of the cost model,
// the model's time of a leg, and the reduction op their legs run.
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

// The model's time of one leg: what the leg's own selector would run on
// `ranks` ranks of one line (`transport`: "shm" inside a host, "tcp" between
// hosts), for `bytes` in the selector's unit (count x item size: a rank's
// block for allgather and reduce_scatter), costed with `t`: the built-in tuning
// table's row where one speaks for that line (its alpha column included; a
// HARP_TUNING_FILE or HARP_ALGO is not consulted), else the cheapest flat
// algorithm whose restrictions hold. Costing a leg as one fixed algorithm
// overprices small legs at many hosts (the leaders' allgather of 32 hosts as a
// ring: 31 latencies; Bruck: 5) and misprices legs a row sends elsewhere.
double legSeconds(CollType coll, double bytes, int ranks, const char* transport, const TransportParams& t);

inline ReduceOp legOp(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

}  // namespace harp::hier
