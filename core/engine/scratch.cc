// core/engine/scratch.cc — see core/engine/scratch.h.
#include "core/engine/scratch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>

namespace harp {

namespace {
size_t pageRound(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}
}  // namespace

Scratch::~Scratch() { trim(0); }

void* Scratch::reserve(size_t bytes) {
  if (bytes <= cap_) return p_;
  const size_t cap = pageRound(bytes);
  void* p = mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (p_) {
    std::memcpy(p, p_, cap_);
    munmap(p_, cap_);
  }
  p_ = p;
  cap_ = cap;
  return p_;
}

void Scratch::trim(size_t keep) {
  if (cap_ <= keep || !p_) return;
  munmap(p_, cap_);
  p_ = nullptr;
  cap_ = 0;
}

}  // namespace harp
