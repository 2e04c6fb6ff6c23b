#include "base/probe.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>

namespace harp {
namespace {

std::string span(const void* p, size_t n) {
  char b[80];
  std::snprintf(b, sizeof b, "[%p, +%zu bytes)", p, n);
  return b;
}

// One byte at each of at[0, n) (addresses in this process) into/out of
// bytes[0, n): the errno of the call (EFAULT also when it stopped early), 0 if fine.
int moveBytes(const uintptr_t* at, char* bytes, int n, bool write) {
  iovec local[2], remote[2];
  for (int i = 0; i < n; ++i) {
    local[i] = {&bytes[i], 1};
    remote[i] = {reinterpret_cast<void*>(at[i]), 1};
  }
  ssize_t k = write ? process_vm_writev(getpid(), local, n, remote, n, 0)
                    : process_vm_readv(getpid(), local, n, remote, n, 0);
  if (k < 0) return errno;
  return k < n ? EFAULT : 0;
}

}  // namespace

std::string probeRange(const void* ptr, size_t bytes, bool written) {
  if (bytes == 0) return "";
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p + bytes < p) return span(ptr, bytes) + " wraps around the address space";
  const uintptr_t at[2] = {p, p + bytes - 1};
  const int n = bytes > 1 ? 2 : 1;
  char saved[2];
  int e = moveBytes(at, saved, n, false);
  if (e == EPERM || e == ENOSYS) return "";  // the kernel will not tell us: do not guess
  if (e) return span(ptr, bytes) + " is not mapped readable in this process (EFAULT)";
  if (!written) return "";
  e = moveBytes(at, saved, n, true);
  if (e == EPERM || e == ENOSYS) return "";
  if (e) return span(ptr, bytes) + " is not writable in this process (read-only memory, EFAULT)";
  return "";
}

}  // namespace harp
