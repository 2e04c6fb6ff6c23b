// core/algorithms/registry.h — the algorithm API and the open registry.
//
// One file per algorithm, named <collective>_<algorithm>.cc (an algorithm that
// needs one transport's internals lives with that transport, e.g.
// transport/shm/allreduce_shm.cc). Each opens with the algorithm's steps,
// restrictions and alpha-beta-gamma cost in prose, and declares itself, next to
// its code, with one registration statement:
//
//   HARP_REGISTER_ALGORITHM({.coll = CollType::kAllreduce, .name = "shm", .fn = allreduceShm,
//                            .restrictions = {.transport = "shm"}, .cost = shmCost,
//                            .fallback = "ring"});
//
// Designated initializers must follow the field order of AlgorithmSpec; every
// field but coll, name, fn and cost may be left out. Adding an algorithm is
// that file plus nothing else: core/CMakeLists.txt compiles every
// core/algorithms/*.cc (a CONFIGURE_DEPENDS glob), the selector (core/select/select.h)
// and `harp-config --explain` see it at once, and a tuning-table row may name it.
//
// An algorithm is a function of a Context (core/engine/context.h): it reads its
// arguments from ctx.args() and moves bytes with ctx.isend/irecv/wait. Within
// its declared restrictions it must work for every count >= 0, in-place and not.
//
// Index: the per-collective number carried in the message tag (4 bits) and the
// descriptor check is the algorithm's position in its collective's algorithms
// sorted by name, so every rank that registered the same algorithms agrees
// without a hand-kept table. Registration happens during static initialisation
// (library or transport-module load), before any communicator exists; a
// transport module hosting an algorithm must be loaded on every rank alike.
//
// Threading: the registry is filled at load time and read-only afterwards.
#pragma once

#include <cstddef>

#include "core/algorithms/algorithm.h"
#include "core/engine/context.h"

namespace harp {

// allreduce_shm's own fallback when the shm transport has no collective area
// (HARP_SHM_COLL_BYTES=0), which the selector cannot see.
void allreduceRing(Context&);
// The ring allreduce's cost (allreduce_ring.cc), also the coalesced ring's.
double ringAllreduceCost(double n, int p, const TransportParams& t);

// Helpers shared by algorithms.
// Copy n bytes unless src == dst.
void copyBytes(void* dst, const void* src, size_t n);
// Allgather input `in` (blk bytes) lies inside the output `out` (p blocks)
// somewhere other than block r, NCCL's in-place position: the algorithm
// must move it out of the way before receiving over it.
bool aliasesOtherBlock(const char* in, const char* out, int r, int p, size_t blk);
// Largest power of two <= n.
int floorPow2(int n);
// ceil(log2 n) for n >= 1 (0 for n = 1).
int ceilLog2(int n);

}  // namespace harp
