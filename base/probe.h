// base/probe.h — is a caller's raw pointer range usable?
//
// Entry points that take raw addresses (the NCCL C API, bindings/nccl) hand
// them to code that touches them with plain loads and stores — the shm
// transport's copies, the reduce kernels — where a bad pointer is a SIGSEGV
// (tcp alone saw EFAULT from send(2)). Probing asks the kernel instead:
//
//   std::string why = probeRange(ptr, bytes, /*written=*/true);
//   if (!why.empty()) fail("receive buffer " + why);
//
// The first and the last byte of [ptr, ptr+bytes) are read with
// process_vm_readv on this process (EFAULT: not mapped / not readable); for a
// range that will be written, they are written back unchanged with
// process_vm_writev (EFAULT: read-only). A wild pointer or a wrong count is
// caught; a hole in the middle of an otherwise mapped range is not (probing
// every page would cost ~ms per 256 MiB). Cost: one or two syscalls per buffer
// (~1 us) — for raw-pointer entry points, not for Python's buffer-protocol
// objects (their memory is mapped by construction).
// Where the kernel refuses these calls to this process (EPERM, ENOSYS under a
// seccomp filter), the probe passes: it never fails a good buffer.
//
// Thread-safe; no state. A written range's bytes are rewritten with their own
// values, so probe before the operation owns the buffer, not during it.
#pragma once

#include <cstddef>
#include <string>

namespace harp {

// "" when every page of the range is readable (and writable when `written`),
// else what is wrong: "[0x10, +64 bytes) is not mapped in this process (EFAULT)".
std::string probeRange(const void* ptr, size_t bytes, bool written);

}  // namespace harp
