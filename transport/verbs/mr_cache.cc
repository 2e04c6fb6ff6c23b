// transport/verbs/mr_cache.cc — memory registration cache (see mr_cache.h).
#include "transport/verbs/mr_cache.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/env.h"
#include "base/log.h"
#include "base/types.h"

namespace harp::transport::verbs {

namespace {
uintptr_t pageSize() {
  static const uintptr_t ps = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return ps;
}
std::string memlockHint() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    return " (RLIMIT_MEMLOCK is " + std::to_string(rl.rlim_cur / 1024) +
           " KiB; raise it with `ulimit -l unlimited` or limits.conf)";
  return "";
}
}  // namespace

MrCache::MrCache(ibv_pd* pd) : pd_(pd) {
  std::string mode = env::str("HARP_IB_MR_CACHE");
  if (mode != "safe" && mode != "lazy")
    throw InvalidArgument("HARP_IB_MR_CACHE='" + mode + "' (use 'safe' or 'lazy')");
  lazy_ = mode == "lazy";
  long long m = env::integer("HARP_IB_MR_CACHE_MAX");
  max_entries_ = m < 1 ? 1 : static_cast<size_t>(m);
}

MrCache::~MrCache() {
  for (auto& [a, e] : entries_) {
    ibv_dereg_mr(e->mr);
    delete e;
  }
}

MrEntry* MrCache::find(uintptr_t a, uintptr_t b, bool write) {
  // Entries starting at or before a, nearest first; a few are enough (ranges
  // rarely nest deeply).
  auto it = entries_.upper_bound(a);
  for (int scanned = 0; it != entries_.begin() && scanned < 16; ++scanned) {
    --it;
    MrEntry* e = it->second;
    if (e->end >= b && (e->writable || !write)) return e;
  }
  return nullptr;
}

MrEntry* MrCache::add(uintptr_t a, uintptr_t b, bool write, const void* user, size_t n) {
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* mr = ibv_reg_mr(pd_, reinterpret_cast<void*>(a), b - a, access);
  bool writable = mr != nullptr;
  if (!mr && !write && errno == EFAULT) {
    // Read-only memory (a const array, a read-only mapping) can still be sent.
    mr = ibv_reg_mr(pd_, reinterpret_cast<void*>(a), b - a, 0);
  }
  if (!mr) {
    int err = errno;
    throw Error(Error::kSystem, "ibv_reg_mr of the " + std::to_string(n) + "-byte " +
                                    (write ? "receive" : "send") + " buffer at " +
                                    std::to_string(reinterpret_cast<uintptr_t>(user)) + " failed: " +
                                    std::strerror(err) + (err == ENOMEM || err == EAGAIN ? memlockHint() : ""));
  }
  ++stats_.registrations;
  auto* e = new MrEntry;
  e->start = a;
  e->end = b;
  e->mr = mr;
  e->writable = writable;
  entries_.emplace(a, e);
  return e;
}

MrEntry* MrCache::acquire(const void* p, size_t n, bool write) {
  uintptr_t ps = pageSize();
  uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(ps - 1);
  uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n + ps - 1) & ~(ps - 1);
  MrEntry* e = find(a, b, write);
  if (e) {
    ++stats_.hits;
  } else {
    e = add(a, b, write, p, n);
  }
  if (e->in_lru) {
    lru_.erase(e->lru);
    e->in_lru = false;
  }
  ++e->refs;
  return e;
}

void MrCache::release(MrEntry* e) {
  if (!e || --e->refs > 0) return;
  if (e->pinned) return;
  if (!lazy_) return drop(e);
  lru_.push_front(e);
  e->lru = lru_.begin();
  e->in_lru = true;
  trim();
}

void MrCache::invalidate(MrEntry* e) {
  if (!e) return;
  if (e->refs > 0) --e->refs;
  // Pinned memory is the caller's to manage; otherwise make the rkey useless.
  if (!e->pinned && e->refs == 0) drop(e);
}

void MrCache::drop(MrEntry* e) {
  if (e->in_lru) lru_.erase(e->lru);
  auto range = entries_.equal_range(e->start);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == e) {
      entries_.erase(it);
      break;
    }
  ibv_dereg_mr(e->mr);
  ++stats_.deregistrations;
  delete e;
}

void MrCache::trim() {
  while (lru_.size() > max_entries_) {
    MrEntry* e = lru_.back();
    ++stats_.evictions;
    drop(e);
  }
}

void MrCache::pin(const void* p, size_t n) {
  if (!p || n == 0) throw InvalidArgument("registerMemory: empty range");
  MrEntry* e = acquire(p, n, true);
  e->pinned = true;
  --e->refs;
}

void MrCache::unpin(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (auto& [start, e] : entries_) {
    if (e->pinned && a >= e->start && a < e->end) {
      e->pinned = false;
      if (e->refs == 0) {
        if (lazy_) {
          lru_.push_front(e);
          e->lru = lru_.begin();
          e->in_lru = true;
          trim();
        } else {
          drop(e);
        }
      }
      return;
    }
  }
}

}  // namespace harp::transport::verbs
