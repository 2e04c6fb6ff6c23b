// bench/sim/emit/trace_memory.cc — memory the traced algorithms see, and the
// copies they make recorded instead of done.
//
// Buffers (main.cc) and scratch (Context::scratch, trace_context.cc) are
// reserved address space (MAP_NORESERVE) that nothing may touch: a 1024-rank
// allgather's buffers would otherwise be faulted in, and copied, once per
// rank. harp_sched therefore defines memcpy, memmove and memset itself (the
// executable's definitions win over libc's for every caller in it, and the
// algorithm files are compiled with -fno-builtin so that each copy is a call):
// a copy or fill that touches a registered region is an X line ("copy",
// "fill") of the current Schedule and moves nothing; every other call (the
// emitter's own strings and vectors) goes to libc's function, found with
// dlsym(RTLD_NEXT).
//
// Threading: single-threaded, as harp_sched.
#include <dlfcn.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "bench/sim/emit/schedule.h"

namespace harp::sim {
namespace {
struct Region {
  uintptr_t lo = 0, hi = 0;
};
Region g_regions[8];
int g_nregions = 0;
bool g_recording = false;

bool inside(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (int i = 0; i < g_nregions; ++i)
    if (a >= g_regions[i].lo && a < g_regions[i].hi) return true;
  return false;
}
}  // namespace

void* reserveRegion(size_t bytes) {
  if (g_nregions == 8) throw std::logic_error("harp_sched: more than 8 reserved regions");
  bytes = bytes ? bytes : 1;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("harp_sched: cannot reserve " + std::to_string(bytes) + " bytes");
  g_regions[g_nregions++] = {reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + bytes};
  return p;
}

void setRecording(bool on) { g_recording = on; }

bool recordCopy(const char* what, void* dst, const void* src, size_t n) {
  if (!g_recording || !(inside(dst) || (src && inside(src)))) return false;
  current().work(what, n);
  return true;
}

}  // namespace harp::sim

namespace {
// libc's function; while dlsym itself runs (it may copy), a plain loop (this
// file is compiled with -fno-tree-loop-distribute-patterns: the loops stay loops).
void* g_real[3];
bool g_resolving = false;
void* resolve(int i, const char* name) {
  if (!g_real[i] && !g_resolving) {
    g_resolving = true;
    g_real[i] = dlsym(RTLD_NEXT, name);
    g_resolving = false;
  }
  return g_real[i];
}
void* loopMove(void* dst, const void* src, size_t n) {
  auto* d = static_cast<volatile unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  if (d < s)
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  else
    for (size_t i = n; i-- > 0;) d[i] = s[i];
  return dst;
}
}  // namespace

extern "C" {
void* memcpy(void* dst, const void* src, size_t n) {
  if (n && harp::sim::recordCopy("copy", dst, src, n)) return dst;
  using Fn = void* (*)(void*, const void*, size_t);
  if (auto f = reinterpret_cast<Fn>(resolve(0, "memcpy"))) return f(dst, src, n);
  return loopMove(dst, src, n);
}
void* memmove(void* dst, const void* src, size_t n) {
  if (n && harp::sim::recordCopy("copy", dst, src, n)) return dst;
  using Fn = void* (*)(void*, const void*, size_t);
  if (auto f = reinterpret_cast<Fn>(resolve(1, "memmove"))) return f(dst, src, n);
  return loopMove(dst, src, n);
}
void* memset(void* dst, int c, size_t n) {
  if (n && harp::sim::recordCopy("fill", dst, nullptr, n)) return dst;
  using Fn = void* (*)(void*, int, size_t);
  if (auto f = reinterpret_cast<Fn>(resolve(2, "memset"))) return f(dst, c, n);
  auto* d = static_cast<volatile unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<unsigned char>(c);
  return dst;
}
}
