// core/engine/scratch.h — the communicator's scratch block (Context::scratch).
//
// One block of anonymous memory (mmap, not the malloc heap) that the
// algorithms borrow for partial sums and staging, reused across collectives.
// Its size is the largest request since the last trim; after each collective
// the communicator trims it to HARP_SCRATCH_KEEP_BYTES (base/params.def):
// a block larger than that goes back to the kernel at once, so a job's resident
// memory does not keep the high-water mark of its largest message (a 64 MiB
// integer-avg reduce used to pin 128 MiB for the communicator's life).
// Being mmap'd, the block never sits in a malloc arena: freeing it returns
// pages whatever glibc's dynamic mmap threshold has grown to, and it cannot
// fragment the heap the application allocates from.
//
// Threading: touched only under the communicator's execution lock.
#pragma once

#include <cstddef>

namespace harp {

class Scratch {
 public:
  Scratch() = default;
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // At least `bytes` (page-rounded; nullptr for 0 with no block), keeping the
  // old block's contents when it has to grow. Throws std::bad_alloc.
  void* reserve(size_t bytes);
  // Unmaps the block when it is larger than `keep` bytes.
  void trim(size_t keep);
  size_t capacity() const { return cap_; }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace harp
