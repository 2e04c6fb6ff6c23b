// harp/harp.h — HARP's public C++ API: one header, the standard library only.
//
// Usage (three processes; each runs this with its own rank):
//
//   #include <harp/harp.h>
//   namespace hp = harp::api;
//   hp::UniqueId id = ...;                     // made once: hp::UniqueId::create(),
//                                              // handed to every rank (id.hex() / fromHex)
//   hp::Comm comm = hp::Comm::create(id, rank, 3);
//   std::vector<float> x(n, 1.0f);
//   comm.allreduce(x.data(), x.data(), n, hp::DataType::kFloat32, hp::ReduceOp::kSum);
//   hp::Work w = comm.broadcast(x.data(), n, hp::DataType::kFloat32, 0, hp::CallOptions{true});  // async
//   w.wait();                                  // throws the collective's error
//   comm.destroy();
//
// Build: c++ -std=c++17 -I<prefix>/include app.cc -L<dir of libharp.so> -lharp
// (the wheel ships this header as harp/include/harp/harp.h beside libharp.so;
// a CMake install puts it under <prefix>/harp/include).
//
// The calls: every rank calls the same collectives in the same order with
// agreeing arguments (count, dtype, op, root); counts are in elements, as
// noted per call. sendbuf == recvbuf is in place where a call allows it
// (allreduce, reduce, alltoall; reduce_scatter and scatter with the receive
// buffer at this rank's block of the send buffer). Every call returns a Work:
// by default (CallOptions::async false) the call has completed, or thrown,
// when it returns; with async true it is queued on the communicator's worker
// thread and the Work reports its end. Collectives complete in call order.
//
// Errors: every failure is a harp::api::Error, whose kind() says what went
// wrong. kInvalidArgument (the message names the argument: "broadcast: root 7
// is out of range for 3 ranks") is found before anything is sent and leaves
// the communicator usable. Every other kind (kMismatch: ranks disagreed;
// kPeerFailure: a peer died or aborted; kTimeout; kRevoked ...) breaks the
// communicator on every rank: each later call raises the same error; destroy
// it and make a new one.
//
// Lifetime: Comm and Work are shared handles (copies refer to one
// communicator / one operation). The communicator lives until destroy() or
// until the last Comm handle goes; either waits for queued work. A Comm made
// by the default constructor, or a split() that left this rank out, is empty
// (operator bool false); calling a collective on it throws kInvalidArgument.
// Buffers passed to an async call must stay valid until its Work has finished.
// A UniqueId serves one communicator (its store retires once that
// communicator formed); keep the process that created it alive until every
// rank has joined.
//
// Threading: calls on one Comm come from one thread at a time (the order of
// calls is the order of collectives on every rank); two threads inside one
// communicator at once break it and raise kInvalidArgument naming both.
// abort() may be called from any thread. A Work may be waited on from any
// thread. Different communicators are independent.
//
// Configuration: HARP_* environment variables (docs/params.md), read when a
// communicator is created; CommOptions and CallOptions override the two most
// common.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace harp::api {

namespace detail {
struct Access;  // the library's side of the handles
}

// The element types and reductions (the values match HARP's vocabulary,
// base/vocab.def; the library checks this at build time).
enum class DataType : uint8_t {
  kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5,
  kFloat16 = 6, kBfloat16 = 7, kFloat32 = 8, kFloat64 = 9, kBool = 10,
};
enum class ReduceOp : uint8_t {
  kSum = 0, kProd = 1, kMin = 2, kMax = 3, kAvg = 4, kBand = 5, kBor = 6, kBxor = 7,
};

// What failed (see Errors above).
enum class ErrorKind : int {
  kInvalidArgument = 0,  // bad input, found locally; the communicator stays usable
  kMismatch = 1,         // ranks disagree about a collective (count, dtype, op, root, kind)
  kPeerFailure = 2,      // a peer died, disconnected or aborted
  kTimeout = 3,          // a wait ran past its deadline
  kSystem = 4,           // an OS or library call failed
  kUnavailable = 5,      // a transport or feature is not available here
  kInternal = 6,         // a HARP bug
  kRevoked = 7,          // some rank revoked or aborted the communicator
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// 128 opaque bytes (NCCL's ncclUniqueId size): the address of a rendezvous
// store served by the process that created it, and a secret that
// authenticates every connection. Treat it like a password.
struct UniqueId {
  std::array<unsigned char, 128> bytes{};
  // A fresh id whose store runs in this process (a thread) until the
  // communicator made from it has formed and every rank let go.
  static UniqueId create();
  std::string hex() const;                       // 256 hex digits, for an environment variable or file
  static UniqueId fromHex(const std::string& hex);  // throws kInvalidArgument on a malformed id
};

struct CommOptions {
  double timeout_s = -1;  // every blocking wait's limit; < 0: HARP_TIMEOUT (default 300 s)
  std::string transport;  // "" : HARP_TRANSPORT, or the best per peer (tcp, shm, verbs, ...)
};

struct CallOptions {
  bool async = false;     // queue the call; the returned Work reports its end
  double timeout_s = -1;  // < 0: the communicator's
  std::string algo;       // "" : the tuner's choice (HARP_ALGO); else an algorithm name
};

// One call's completion.
class Work {
 public:
  Work() = default;  // an empty Work counts as finished
  // Wait for the end (timeout_s < 0: until it ends; the call has its own
  // timeout). Throws the call's Error; false if timeout_s passed first.
  bool wait(double timeout_s = -1);
  bool test() const;          // finished (either way); never throws
  bool failed() const;        // finished with an error
  std::string error() const;  // that error's message ("" if none)

 private:
  friend struct detail::Access;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

class Comm {
 public:
  Comm() = default;
  // Collective: `size` processes call it with the same id, each with its own
  // rank in [0, size). Returns once every rank has joined and connected.
  static Comm create(const UniqueId& id, int rank, int size, const CommOptions& o = {});

  explicit operator bool() const;  // false: empty, or destroyed
  int rank() const;
  int size() const;

  // sendbuf: count elements; recvbuf: the reduction of every rank's sendbuf.
  Work allreduce(const void* sendbuf, void* recvbuf, size_t count, DataType dt, ReduceOp op,
                 const CallOptions& o = {});
  // buf: count elements, the root's sent to every rank.
  Work broadcast(void* buf, size_t count, DataType dt, int root, const CallOptions& o = {});
  // Like allreduce, but only the root's recvbuf is written (others may pass nullptr).
  Work reduce(const void* sendbuf, void* recvbuf, size_t count, DataType dt, ReduceOp op, int root,
              const CallOptions& o = {});
  // sendbuf: count elements; recvbuf: size() * count, rank r's block at r * count.
  Work allgather(const void* sendbuf, void* recvbuf, size_t count, DataType dt, const CallOptions& o = {});
  // sendbuf: size() * count; recvbuf: count, this rank's block of the reduction.
  Work reduce_scatter(const void* sendbuf, void* recvbuf, size_t count, DataType dt, ReduceOp op,
                      const CallOptions& o = {});
  // sendbuf and recvbuf: size() * count; block j of sendbuf goes to rank j.
  Work alltoall(const void* sendbuf, void* recvbuf, size_t count, DataType dt, const CallOptions& o = {});
  // sendbuf: count; the root's recvbuf: size() * count (others may pass nullptr).
  Work gather(const void* sendbuf, void* recvbuf, size_t count, DataType dt, int root, const CallOptions& o = {});
  // The root's sendbuf: size() * count (others may pass nullptr); recvbuf: count.
  Work scatter(const void* sendbuf, void* recvbuf, size_t count, DataType dt, int root, const CallOptions& o = {});
  Work barrier(const CallOptions& o = {});
  // Point to point: count elements to / from `peer`; a send matches the
  // peer's recv with the same tag and count.
  Work send(const void* buf, size_t count, DataType dt, int peer, uint32_t tag = 0, const CallOptions& o = {});
  Work recv(void* buf, size_t count, DataType dt, int peer, uint32_t tag = 0, const CallOptions& o = {});

  // Collective: ranks with the same color form a new communicator, ranked by
  // (key, old rank). color < 0: this rank joins none and gets an empty Comm.
  Comm split(int color, int key) const;
  // Break the communicator on every rank (best effort): pending and later
  // calls fail with the reason. Any thread; not collective.
  void abort(const std::string& reason);
  // Wait for queued work, tell the peers goodbye, release everything. Every
  // handle of this communicator is then empty. Idempotent; may throw an
  // Error found by a last deferred check (a disagreement in an earlier call).
  void destroy();

 private:
  friend struct detail::Access;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace harp::api
