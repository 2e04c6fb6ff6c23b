// transport/shm/shm_segment.h — layout of the shared-memory segment each rank
// owns for one communicator, and the low-level helpers around it (anonymous
// memory file creation, futex wait/wake).
//
// One segment per rank per communicator. It is an anonymous memory file
// (memfd_create; fallback shm_open + immediate shm_unlink) that never has a
// name in /dev/shm, passed to same-host peers over a unix socket
// (SCM_RIGHTS), so nothing can leak when a process exits or is killed.
//
// Layout (all offsets multiples of 64):
//   SegHeader                       rank's doorbell futex + sleeping flag
//   for each local peer slot i:     RingCtl[i] + nslots * slot_bytes
//                                    (ring carrying messages peer -> owner)
//   CollArea                        flags + 2 * coll_chunk * ... for
//                                    intra-host algorithms (allreduce_shm)
//
// Ownership of every field is written next to it: exactly one process writes
// each cache line, which is what keeps the rings lock-free.
//
// Threading: plain data + free functions; the atomics are the protocol.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace harp::transport::shm {

constexpr size_t kLine = 64;
constexpr uint64_t kSegMagic = 0x31304d5350524148ull;  // "HARPSM01"
constexpr uint32_t kSegVersion = 1;

inline size_t alignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Header of a rank's segment. Written by the owner except `doorbell`, which
// everybody increments to wake the owner.
struct SegHeader {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t nlocal;
  int32_t pid;
  uint64_t comm_id;
  alignas(kLine) std::atomic<uint32_t> doorbell;  // futex word (shared, not PRIVATE)
  alignas(kLine) std::atomic<uint32_t> sleeping;  // owner is (about to be) blocked in futex
};
static_assert(sizeof(SegHeader) == 3 * kLine);

// Control block of the ring that carries messages from peer P to owner O. It
// lives in O's segment. Each field has its own cache line.
struct RingCtl {
  alignas(kLine) std::atomic<uint64_t> tail;   // written by O: slots consumed
  alignas(kLine) std::atomic<uint64_t> acks;   // written by P: O->P CMA messages P has read
  alignas(kLine) std::atomic<uint32_t> abort;  // written by P: P aborted, reason below
  char reason[kLine * 3 - sizeof(uint32_t)];
};
static_assert(sizeof(RingCtl) == 5 * kLine);

// First bytes of every slot. `seq` is the validity flag: slot index k of the
// ring (monotonic) is valid when seq == k + 1; written last (release).
struct SlotHdr {
  std::atomic<uint64_t> seq;
  uint64_t tag;
  uint64_t len;      // total message length
  uint32_t kind;     // SlotKind
  uint32_t nbytes;   // payload bytes in this slot
};
static_assert(sizeof(SlotHdr) == 32);
enum SlotKind : uint32_t { kMsg = 1, kCont = 2, kCma = 3 };
inline uint8_t* payload(SlotHdr* h) { return reinterpret_cast<uint8_t*>(h) + sizeof(SlotHdr); }
inline const uint8_t* payload(const SlotHdr* h) { return reinterpret_cast<const uint8_t*>(h) + sizeof(SlotHdr); }

// Flags of the intra-host collective area (allreduce_shm). Monotonic step
// counters, each written only by the owner, each on its own line.
// A step's input that fits in one cache line travels with its flag and
// descriptor: readers poll the very line that holds the data.
struct TinySlot {
  std::atomic<uint64_t> step;  // step s whose data this is (written last)
  uint64_t desc;
  uint8_t data[kLine - 16];
};
static_assert(sizeof(TinySlot) == kLine);
struct CollFlags {
  alignas(kLine) std::atomic<uint64_t> ready;    // input chunk for step s copied in
  alignas(kLine) std::atomic<uint64_t> reduced;  // my slice of step s reduced
  alignas(kLine) std::atomic<uint64_t> desc[2];  // collective descriptor (tag) of the step in buffer b
  alignas(kLine) TinySlot tiny[2];               // steps whose input is <= 48 bytes
};

struct Geometry {
  int nlocal = 1;            // ranks sharing this host (segment has nlocal rings)
  uint32_t nslots = 64;      // slots per ring
  uint32_t slot_bytes = 8192;
  uint64_t coll_chunk = 0;   // bytes per collective buffer (2 buffers); 0 = none

  size_t ringBytes() const { return sizeof(RingCtl) + size_t(nslots) * slot_bytes; }
  size_t ringOffset(int i) const { return sizeof(SegHeader) + size_t(i) * ringBytes(); }
  size_t collOffset() const { return alignUp(ringOffset(nlocal), 4096); }
  size_t collBytes() const { return coll_chunk ? alignUp(sizeof(CollFlags), kLine) + 2 * coll_chunk : 0; }
  size_t total() const { return alignUp(collOffset() + collBytes(), 4096); }
};

// A mapped segment (own or a peer's).
struct Segment {
  int fd = -1;
  uint8_t* base = nullptr;
  size_t bytes = 0;
  Geometry geo;

  SegHeader* header() const { return reinterpret_cast<SegHeader*>(base); }
  RingCtl* ctl(int i) const { return reinterpret_cast<RingCtl*>(base + geo.ringOffset(i)); }
  uint8_t* slots(int i) const { return base + geo.ringOffset(i) + sizeof(RingCtl); }
  CollFlags* collFlags() const {
    return geo.coll_chunk ? reinterpret_cast<CollFlags*>(base + geo.collOffset()) : nullptr;
  }
  uint8_t* collBuf(int b) const {
    return base + geo.collOffset() + alignUp(sizeof(CollFlags), kLine) + size_t(b) * geo.coll_chunk;
  }
  void unmap();
};

// Create this rank's segment: an anonymous memory file of geo.total() bytes
// with all pages allocated up front (so a full tmpfs or memory limit is an
// error here, never a SIGBUS later). Throws harp::Error naming the cause and
// the fix. `how` receives "memfd" or "shm_open+unlink".
Segment createSegment(const Geometry& geo, std::string* how);
// Map a peer's segment received as an fd; checks its size. Takes the fd.
Segment mapSegment(int fd, const Geometry& geo, const std::string& who);

// futex on a word in shared memory (no FUTEX_PRIVATE_FLAG: other processes
// wake it). Wait returns on wake, value change, signal or timeout.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void futexWakeAll(std::atomic<uint32_t>* word);

// Wake the owner of `h` if it is sleeping. Callers publish their change first;
// the seq_cst fence here orders that store before the `sleeping` load (the
// owner does the mirror image: store sleeping, fence, re-check).
inline void wakeIfSleeping(SegHeader* h) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (h->sleeping.load(std::memory_order_relaxed)) {
    h->doorbell.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&h->doorbell);
  }
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace harp::transport::shm
