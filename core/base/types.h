// core/base/types.h — the vocabulary every HARP layer shares: datatypes, reduction
// operators, collective kinds, and the error type.
//
// Everything here is plain data and free functions; it is safe to use from any
// thread. Enum values are part of the Python and NCCL bindings' ABI: append,
// never renumber.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace harp {

enum class DataType : uint8_t {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kBfloat16 = 7,
  kFloat32 = 8,
  kFloat64 = 9,
  kBool = 10,
};
constexpr int kNumDataTypes = 11;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,   // sum, then divide by the rank count (integer types: truncating division)
  kBand = 5,  // bitwise; integer and bool types only
  kBor = 6,
  kBxor = 7,
};
constexpr int kNumReduceOps = 8;

enum class CollType : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kReduce = 2,
  kAllgather = 3,
  kReduceScatter = 4,
  kAlltoall = 5,
  kAlltoallv = 6,
  kGather = 7,
  kScatter = 8,
  kBarrier = 9,
  kSend = 10,
  kRecv = 11,
  kP2pBatch = 12,  // a group of sends and receives that progress together (CollArgs::p2p)
};
constexpr int kNumCollTypes = 13;

// Everything ranks must agree on for one collective, exactly (24 bytes; the
// payload of the descriptor check).
struct Descriptor {
  uint32_t seq = 0;
  uint8_t coll = 0, dtype = 0, op = 0, algo = 0;
  int64_t root = 0;
  uint64_t count = 0;
  bool operator==(const Descriptor& o) const {
    return seq == o.seq && coll == o.coll && dtype == o.dtype && op == o.op && algo == o.algo && root == o.root &&
           count == o.count;
  }
};
static_assert(sizeof(Descriptor) == 24);
size_t dtypeSize(DataType dt);
const char* dtypeName(DataType dt);
const char* opName(ReduceOp op);
const char* collName(CollType c);
// Parse "float32" / "sum" / "allreduce" (the names above); throw InvalidArgument naming the input.
DataType parseDtype(const std::string& s);
ReduceOp parseOp(const std::string& s);
CollType parseColl(const std::string& s);
// Throws InvalidArgument when `op` is not defined for `dt` (bitwise on floats, avg on bool).
void checkOpSupported(DataType dt, ReduceOp op);

// All HARP failures are harp::Error. `kind` lets bindings map them to their own
// error vocabulary (Python exception classes, ncclResult_t).
class Error : public std::runtime_error {
 public:
  enum Kind {
    kInvalidArgument,  // bad input detected locally
    kMismatch,         // ranks disagree about a collective (count, dtype, op, root, kind)
    kPeerFailure,      // a peer died, disconnected or aborted
    kTimeout,          // a blocking wait ran past its deadline
    kSystem,           // OS / library call failed
    kUnavailable,      // transport or feature not available on this machine/build
    kInternal,
  };
  Error(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

inline Error InvalidArgument(const std::string& m) { return Error(Error::kInvalidArgument, m); }
inline Error SystemError(const std::string& m) { return Error(Error::kSystem, m); }
// "what: strerror(errno)"
Error ErrnoError(const std::string& what, int err);

}  // namespace harp
