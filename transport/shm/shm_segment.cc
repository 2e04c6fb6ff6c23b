// transport/shm/shm_segment.cc — anonymous shared-memory files and futexes
// for the shm transport. See shm_segment.h. Thread-safe (no shared state).
#include "transport/shm/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "base/env.h"
#include "base/log.h"
#include "base/types.h"

namespace harp::transport::shm {
namespace {

std::string mb(size_t b) { return std::to_string((b + (1 << 20) - 1) >> 20) + " MB"; }

// Allocate every page now; a full tmpfs / memory cgroup becomes ENOSPC here.
int reserve(int fd, size_t bytes) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return errno;
  int rc;
  do rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  while (rc == EINTR);
  return rc;  // 0 or an errno value (posix_fallocate does not set errno)
}

int openMemfd(size_t bytes, int* err) {
  if (env::flag("HARP_SHM_NO_MEMFD")) {  // testing knob: exercise the fallback
    *err = ENOSYS;
    return -1;
  }
  int fd = static_cast<int>(syscall(SYS_memfd_create, "harp-shm", 1u /*MFD_CLOEXEC*/));
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  *err = reserve(fd, bytes);
  if (*err) {
    close(fd);
    return -1;
  }
  return fd;
}

// shm_open fallback: the name exists only between shm_open and shm_unlink,
// a few microseconds; the fd is what gets shared.
int openShm(size_t bytes, int* err) {
  char name[64];
  unsigned long long r = 0;
  for (int attempt = 0; attempt < 16; ++attempt) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r = (static_cast<unsigned long long>(ts.tv_nsec) << 20) ^ (static_cast<unsigned long long>(getpid()) << 3) ^
        static_cast<unsigned long long>(attempt);
    snprintf(name, sizeof name, "/harp-shm-%d-%llx", (int)getpid(), r);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      *err = errno;
      return -1;
    }
    shm_unlink(name);
    *err = reserve(fd, bytes);
    if (*err) {
      close(fd);
      return -1;
    }
    return fd;
  }
  *err = EEXIST;
  return -1;
}

}  // namespace

void Segment::unmap() {
  if (base) munmap(base, bytes);
  if (fd >= 0) close(fd);
  base = nullptr;
  fd = -1;
}

Segment createSegment(const Geometry& geo, std::string* how) {
  Segment s;
  s.geo = geo;
  s.bytes = geo.total();
  int err = 0;
  int fd = openMemfd(s.bytes, &err);
  if (fd >= 0) {
    *how = "memfd";
  } else if (err == ENOSPC || err == ENOMEM) {
    throw Error(Error::kSystem,
                "shm transport: cannot allocate a " + mb(s.bytes) +
                    " shared-memory segment (memfd: " + std::strerror(err) +
                    "): the memory limit of this process or container is reached; free memory, "
                    "lower HARP_SHM_SLOTS/HARP_SHM_SLOT_BYTES/HARP_SHM_COLL_BYTES, or set "
                    "HARP_TRANSPORT=tcp");
  } else {
    HARP_INFO_S(LogSubsys::kShm, "shm: memfd_create unavailable (%s), falling back to shm_open+unlink in /dev/shm",
              std::strerror(err));
    int err2 = 0;
    fd = openShm(s.bytes, &err2);
    if (fd < 0) {
      std::string why = std::strerror(err2);
      if (err2 == ENOSPC || err2 == ENOMEM)
        throw Error(Error::kSystem,
                    "shm transport: /dev/shm is too small for a " + mb(s.bytes) +
                        " segment (" + why +
                        "; memfd_create was unavailable too). Enlarge it (docker run --shm-size=1g, "
                        "or mount -o remount,size=1G /dev/shm), lower HARP_SHM_SLOTS/"
                        "HARP_SHM_COLL_BYTES, or set HARP_TRANSPORT=tcp");
      throw Error(Error::kSystem, "shm transport: cannot create a shared-memory segment: memfd_create: " +
                                      std::string(std::strerror(err)) + ", shm_open(/dev/shm): " + why);
    }
    HARP_WARN("shm: memfd_create unavailable (%s); using /dev/shm (shm_open, unlinked at once)",
              std::strerror(err));
    *how = "shm_open+unlink";
  }
  void* p = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    throw ErrnoError("shm transport: mmap of " + mb(s.bytes) + " segment", e);
  }
  s.fd = fd;
  s.base = static_cast<uint8_t*>(p);
  return s;
}

Segment mapSegment(int fd, const Geometry& geo, const std::string& who) {
  Segment s;
  s.geo = geo;
  s.bytes = geo.total();
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != s.bytes) {
    close(fd);
    throw Error(Error::kSystem, "shm transport: segment received from " + who + " has size " +
                                    std::to_string(st.st_size) + ", expected " + std::to_string(s.bytes) +
                                    " (HARP_SHM_* settings differ between ranks?)");
  }
  void* p = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    throw ErrnoError("shm transport: mmap of the segment of " + who, e);
  }
  // The mapping keeps the memory alive; the fd is not needed any more.
  close(fd);
  s.base = static_cast<uint8_t*>(p);
  const SegHeader* h = s.header();
  if (h->magic != kSegMagic || h->version != kSegVersion) {
    s.unmap();
    throw Error(Error::kSystem, "shm transport: segment received from " + who + " has a bad header");
  }
  return s;
}

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts;
  ts.tv_sec = timeout_ms / 1000;
  ts.tv_nsec = static_cast<long>(timeout_ms % 1000) * 1000000L;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace harp::transport::shm
