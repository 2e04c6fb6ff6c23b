#include "core/base/types.h"

#include <cstring>

namespace harp {
namespace {
const char* kDtypeNames[kNumDataTypes] = {"int8",    "uint8",    "int32",   "uint32",
                                          "int64",   "uint64",   "float16", "bfloat16",
                                          "float32", "float64",  "bool"};
const size_t kDtypeSizes[kNumDataTypes] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8, 1};
const char* kOpNames[kNumReduceOps] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
const char* kCollNames[kNumCollTypes] = {"allreduce", "broadcast",  "reduce", "allgather",
                                         "reduce_scatter", "alltoall", "alltoallv", "gather",
                                         "scatter", "barrier", "send", "recv",
                                         "p2p_batch"};

template <size_t N>
int lookup(const char* (&names)[N], const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<int>(i);
  return -1;
}

std::string choices(const char* const* names, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? ", " : "") + std::string(names[i]);
  return out;
}
}  // namespace

size_t dtypeSize(DataType dt) {
  auto i = static_cast<unsigned>(dt);
  if (i >= kNumDataTypes) throw InvalidArgument("unknown datatype code " + std::to_string(i));
  return kDtypeSizes[i];
}

const char* dtypeName(DataType dt) {
  auto i = static_cast<unsigned>(dt);
  return i < kNumDataTypes ? kDtypeNames[i] : "?";
}

const char* opName(ReduceOp op) {
  auto i = static_cast<unsigned>(op);
  return i < kNumReduceOps ? kOpNames[i] : "?";
}

const char* collName(CollType c) {
  auto i = static_cast<unsigned>(c);
  return i < kNumCollTypes ? kCollNames[i] : "?";
}

DataType parseDtype(const std::string& s) {
  int i = lookup(kDtypeNames, s);
  if (s == "half") i = 6;
  if (s == "float" ) i = 8;
  if (s == "double") i = 9;
  if (i < 0) throw InvalidArgument("unknown datatype '" + s + "' (known: " + choices(kDtypeNames, kNumDataTypes) + ")");
  return static_cast<DataType>(i);
}

ReduceOp parseOp(const std::string& s) {
  int i = lookup(kOpNames, s);
  if (i < 0) throw InvalidArgument("unknown reduction op '" + s + "' (known: " + choices(kOpNames, kNumReduceOps) + ")");
  return static_cast<ReduceOp>(i);
}

CollType parseColl(const std::string& s) {
  int i = lookup(kCollNames, s);
  if (i < 0) throw InvalidArgument("unknown collective '" + s + "' (known: " + choices(kCollNames, kNumCollTypes) + ")");
  return static_cast<CollType>(i);
}

void checkOpSupported(DataType dt, ReduceOp op) {
  if (static_cast<unsigned>(dt) >= kNumDataTypes)
    throw InvalidArgument("unknown datatype code " + std::to_string(static_cast<unsigned>(dt)));
  if (static_cast<unsigned>(op) >= kNumReduceOps)
    throw InvalidArgument("unknown reduction op code " + std::to_string(static_cast<unsigned>(op)));
  bool is_float = dt == DataType::kFloat16 || dt == DataType::kBfloat16 || dt == DataType::kFloat32 ||
                  dt == DataType::kFloat64;
  bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (is_float && bitwise)
    throw InvalidArgument(std::string("reduction op '") + opName(op) + "' is not defined for " + dtypeName(dt));
  if (dt == DataType::kBool && op == ReduceOp::kAvg)
    throw InvalidArgument("reduction op 'avg' is not defined for bool");
}

Error ErrnoError(const std::string& what, int err) {
  return Error(Error::kSystem, what + ": " + std::strerror(err));
}

}  // namespace harp
