// transport/verbs/mr_cache.h — memory registration cache for the verbs transport.
//
// Every byte the NIC reads or writes must lie in a registered memory region
// (ibv_reg_mr pins the pages and yields lkey/rkey). Registering is slow
// (pinning, NIC translation tables), so regions are cached, page-aligned, and
// looked up by address range. A request holds a reference on its entry until
// it completes.
//
// What happens to an entry nobody references depends on where the memory
// came from (HARP_IB_MR_CACHE):
//   * registerMemory()'d ranges: kept until deregisterMemory() — the caller
//     promised they stay mapped. Zero-copy, no registration per message.
//   * any other buffer, mode "safe" (default): deregistered when its last
//     request completes. Caching across collectives would be unsafe: a buffer
//     freed and re-allocated at the same address (glibc munmap/mmap does that)
//     maps new pages while the cached region still pins the old ones, so the
//     NIC would read and write the wrong memory.
//   * mode "lazy": kept in an LRU (HARP_IB_MR_CACHE_MAX entries, default 256)
//     like Open MPI's leave_pinned — for programs that reuse their buffers
//     (benchmarks, training loops with persistent tensors).
//
// Single-threaded: owned by one transport, driven by its driving thread.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>

namespace harp::transport::verbs {

struct MrEntry {
  uintptr_t start = 0, end = 0;  // page-aligned [start, end)
  ibv_mr* mr = nullptr;
  int refs = 0;
  bool pinned = false;     // from registerMemory()
  bool writable = false;   // registered with LOCAL_WRITE | REMOTE_WRITE
  std::list<MrEntry*>::iterator lru;
  bool in_lru = false;
};

struct MrStats {
  uint64_t registrations = 0;    // ibv_reg_mr calls that succeeded
  uint64_t hits = 0;             // lookups served by an existing region
  uint64_t deregistrations = 0;
  uint64_t evictions = 0;        // lazy mode: dropped by the LRU bound
};

class MrCache {
 public:
  explicit MrCache(ibv_pd* pd);
  ~MrCache();
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  // A referenced region covering [p, p+n) (n > 0), writable by the NIC when
  // `write` (receive buffers). Throws harp::Error naming the buffer and the
  // reason (memlock limit, bad address) when registration fails.
  MrEntry* acquire(const void* p, size_t n, bool write);
  void release(MrEntry* e);
  // Drop an entry now (its rkey was exposed for a receive that failed).
  void invalidate(MrEntry* e);

  void pin(const void* p, size_t n);     // registerMemory
  void unpin(const void* p);             // deregisterMemory

  const MrStats& stats() const { return stats_; }
  size_t size() const { return entries_.size(); }
  bool lazy() const { return lazy_; }

 private:
  MrEntry* find(uintptr_t a, uintptr_t b, bool write);
  MrEntry* add(uintptr_t a, uintptr_t b, bool write, const void* user, size_t n);
  void drop(MrEntry* e);
  void trim();

  ibv_pd* pd_;
  bool lazy_;
  size_t max_entries_;
  std::multimap<uintptr_t, MrEntry*> entries_;  // by start
  std::list<MrEntry*> lru_;                      // idle entries, most recent first
  MrStats stats_;
};

}  // namespace harp::transport::verbs
