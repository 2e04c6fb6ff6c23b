#include "base/types.h"

#include <cstring>
#include <initializer_list>
#include <iterator>

namespace harp {
namespace {
// Name and size tables indexed by enum value (vocab.def lists them in value order: checked below).
const char* kDtypeNames[kNumDataTypes] = {
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) #name,
#include "base/vocab.def"
};
const size_t kDtypeSizes[kNumDataTypes] = {
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) size,
#include "base/vocab.def"
};
const char* kOpNames[kNumReduceOps] = {
#define HARP_REDOP(name, e, value, py, nccl, ncclv) #name,
#include "base/vocab.def"
};
const char* kCollNames[kNumCollTypes] = {
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) #name,
#include "base/vocab.def"
};
struct Alias {
  const char* alias;
  const char* name;
};
const Alias kDtypeAliases[] = {
#define HARP_DTYPE_ALIAS(alias, name) {#alias, #name},
#include "base/vocab.def"
};
const Alias kOpAliases[] = {
#define HARP_REDOP_ALIAS(alias, name) {#alias, #name},
#include "base/vocab.def"
};

constexpr bool inOrder(std::initializer_list<int> values) {
  int i = 0;
  for (int v : values)
    if (v != i++) return false;
  return true;
}
static_assert(inOrder({
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) value,
#include "base/vocab.def"
              }), "vocab.def: HARP_DTYPE values must be 0, 1, 2, ... in order");
static_assert(inOrder({
#define HARP_REDOP(name, e, value, py, nccl, ncclv) value,
#include "base/vocab.def"
              }), "vocab.def: HARP_REDOP values must be 0, 1, 2, ... in order");
static_assert(inOrder({
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) value,
#include "base/vocab.def"
              }), "vocab.def: HARP_COLL values must be 0, 1, 2, ... in order");

std::string unalias(const std::string& s, const Alias* begin, const Alias* end) {
  for (const Alias* a = begin; a != end; ++a)
    if (s == a->alias) return a->name;
  return s;
}

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
  int i = lookup(kDtypeNames, unalias(s, std::begin(kDtypeAliases), std::end(kDtypeAliases)));
  if (i < 0) throw InvalidArgument("unknown datatype '" + s + "' (known: " + choices(kDtypeNames, kNumDataTypes) + ")");
  return static_cast<DataType>(i);
}

ReduceOp parseOp(const std::string& s) {
  int i = lookup(kOpNames, unalias(s, std::begin(kOpAliases), std::end(kOpAliases)));
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
  const bool is_float = !isInteger(dt) && dt != DataType::kBool;  // vocab.def's integer column
  bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (is_float && bitwise)
    throw InvalidArgument(std::string("reduction op '") + opName(op) + "' is not defined for " + dtypeName(dt));
  if (dt == DataType::kBool && op == ReduceOp::kAvg)
    throw InvalidArgument("reduction op 'avg' is not defined for bool");
}

Error ErrnoError(const std::string& what, int err) {
  return Error(Error::kSystem, what + ": " + std::strerror(err));
}

Error::Kind noticeKind(const std::string& text) {
  if (text.find("collective mismatch") != std::string::npos) return Error::kMismatch;
  if (text.find(kRevokedMark) != std::string::npos) return Error::kRevoked;
  return Error::kPeerFailure;
}

}  // namespace harp
