// base/fork.h — was this object made in this process, or inherited through fork()?
//
// fork() copies a process's memory but only the calling thread. A HARP object
// that a child inherits (a communicator made before the fork: a DataLoader
// worker, a multiprocessing "fork" child, a test harness's ranks) holds handles
// of threads that do not exist in the child, sockets and shared memory that the
// parent's copy still uses, and perhaps locks that a parent thread held at the
// fork. The child can neither use it (its bytes would interleave with the
// parent's on the same connections) nor tear it down (joining a parent's thread
// crashes; a goodbye or an abort notice would break the parent's job).
//
// Usage: record forkGeneration() when the object is made; where it is used or
// destroyed, inheritedAcrossFork(made_in) says this process is a fork of the one
// that made it. Then refuse the use with a clear error, and on destruction let go
// of everything without running its teardown (the child's exit releases it).
//
//   made_in_ = forkGeneration();
//   ...
//   if (inheritedAcrossFork(made_in_)) throw InvalidArgument("... forked ...");
//
// The count rises by one in the child of every fork() (pthread_atfork), so the
// check is one relaxed load. A child made by a raw clone() or vfork() that runs
// HARP code without exec is not seen (none of HARP's callers do that).
#pragma once

#include <atomic>
#include <cstdint>

namespace harp {

namespace detail {
extern std::atomic<uint64_t> g_fork_generation;  // base/fork.cc
}

// How many fork()s lie between the process that loaded HARP and this one (0 in it).
inline uint64_t forkGeneration() { return detail::g_fork_generation.load(std::memory_order_relaxed); }

// True in a process forked (directly or not) from the one where forkGeneration() was `made_in`.
inline bool inheritedAcrossFork(uint64_t made_in) { return forkGeneration() != made_in; }

}  // namespace harp
