// base/types.h — the vocabulary every HARP layer shares: datatypes, reduction
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

// The enums below are generated from base/vocab.def, the one list of
// HARP's vocabulary (python/harp/_types.py builds its classes from the same
// lines through _harp.vocab(); bindings/nccl/nccl.h and python/harp/nccl/ are
// checked against it at build time).
enum class DataType : uint8_t {
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) e = value,
#include "base/vocab.def"
};
constexpr int kNumDataTypes = 0
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) +1
#include "base/vocab.def"
    ;

enum class ReduceOp : uint8_t {
#define HARP_REDOP(name, e, value, py, nccl, ncclv) e = value,
#include "base/vocab.def"
};
constexpr int kNumReduceOps = 0
#define HARP_REDOP(name, e, value, py, nccl, ncclv) +1
#include "base/vocab.def"
    ;
// kAvg: sum, then divide by the rank count (integer types: truncating division).
// kBand, kBor, kBxor: bitwise; integer and bool types only.

enum class CollType : uint8_t {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) e = value,
#include "base/vocab.def"
};
constexpr int kNumCollTypes = 0
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) +1
#include "base/vocab.def"
    ;
// A collective's traits, as vocab.def declares them (its header explains each
// column): it combines data with an op (allreduce, reduce, reduce_scatter,
// allreduce_coalesced), it has a root, it takes per-rank counts.
constexpr bool collReduces(CollType c) {
  switch (c) {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) case CollType::e: return reduces;
#include "base/vocab.def"
  }
  return false;
}
constexpr bool collRooted(CollType c) {
  switch (c) {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) case CollType::e: return rooted;
#include "base/vocab.def"
  }
  return false;
}
constexpr bool collVcounts(CollType c) {
  switch (c) {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) case CollType::e: return vcounts;
#include "base/vocab.def"
  }
  return false;
}
// The byte rule: what one rank's send or receive buffer holds for a call of
// count c at p ranks (vocab.def's send and recv columns; the enumerators are
// spelt as vocab.def spells them); bufferBlocks turns it into blocks of c
// elements on one rank.
enum class Extent : uint8_t { none, count, count_p, root_count, root_count_p, listed };
constexpr Extent collSend(CollType c) {
  switch (c) {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) \
  case CollType::e: return Extent::send;
#include "base/vocab.def"
  }
  return Extent::none;
}
constexpr Extent collRecv(CollType c) {
  switch (c) {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) \
  case CollType::e: return Extent::recv;
#include "base/vocab.def"
  }
  return Extent::none;
}
// Blocks of c elements a buffer of extent `x` holds on a rank (`at_root`: this
// rank is the call's root) of p: 0 (no buffer here), 1 or p. `listed` gives 0:
// such calls describe their buffers themselves (CollArgs counts, pieces, p2p).
constexpr size_t bufferBlocks(Extent x, size_t p, bool at_root) {
  switch (x) {
    case Extent::count: return 1;
    case Extent::count_p: return p;
    case Extent::root_count: return at_root ? 1 : 0;
    case Extent::root_count_p: return at_root ? p : 0;
    default: return 0;
  }
}
// The in-place rule (vocab.def's inplace column): how a call's send and
// receive buffers may overlap; core/engine/validate.cc refuses any other overlap.
enum class InPlaceRule : uint8_t { none, same, block, any, alone, unchecked };
constexpr InPlaceRule collInPlace(CollType c) {
  switch (c) {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) \
  case CollType::e: return InPlaceRule::inplace;
#include "base/vocab.def"
  }
  return InPlaceRule::unchecked;
}
// torch's name for the call (ProcessGroupNCCL's "nccl:<name>" in its flight
// record and profiler); "" for an out-of-range code.
constexpr const char* collTorchName(CollType c) {
  switch (c) {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) \
  case CollType::e: return #torch;
#include "base/vocab.def"
  }
  return "";
}
// kP2pBatch: a group of sends and receives that progress together (CollArgs::p2p).
// kAllreduceCoalesced: one allreduce schedule over a list of buffers (CollArgs::pieces).

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
// dtypeSize without the check, inline (hot paths with a dtype already checked;
// an out-of-range code gives 0).
inline constexpr uint8_t kItemSizes[] = {
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) size,
#include "base/vocab.def"
};
// The integer dtypes, vocab.def's integer column (avg of them is exact integer division,
// core/engine/pipeline.cc runIntAvg).
constexpr bool isInteger(DataType t) {
  switch (t) {
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) case DataType::e: return integer;
#include "base/vocab.def"
  }
  return false;
}
// torch's name of a datatype (its c10 ScalarType: "Float", "BFloat16", ...), vocab.def's torch
// column; "" for an out-of-range code.
constexpr const char* dtypeTorchName(DataType t) {
  switch (t) {
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) case DataType::e: return #torch;
#include "base/vocab.def"
  }
  return "";
}
inline size_t itemSize(DataType dt) {
  const auto i = static_cast<unsigned>(dt);
  return i < static_cast<unsigned>(kNumDataTypes) ? kItemSizes[i] : 0;
}
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
  // base/vocab.def: kInvalidArgument (bad input detected locally),
  // kMismatch (ranks disagree about a collective: count, dtype, op, root,
  // kind), kPeerFailure (a peer died, disconnected or aborted), kTimeout (a
  // blocking wait ran past its deadline), kSystem (OS / library call failed),
  // kUnavailable (transport or feature not available on this machine/build),
  // kInternal (a HARP bug), kRevoked (the communicator was revoked: some rank
  // called revoke(), usually after a failure; see Communicator::revoke).
  enum Kind {
#define HARP_ERROR(e, value, py, nccl) e = value,
#include "base/vocab.def"
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

// The kind of error a peer's abort notice (or a failure text quoting one)
// stands for: kMismatch when it names a collective mismatch, kRevoked when it
// carries kRevokedMark, otherwise kPeerFailure.
constexpr const char* kRevokedMark = "communicator revoked by rank ";
Error::Kind noticeKind(const std::string& text);

}  // namespace harp
