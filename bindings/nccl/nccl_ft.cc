// bindings/nccl/nccl_ft.cc — NCCL's fault-tolerance calls (NCCL 2.27-2.29
// signatures and flags, nccl.h): ncclCommRevoke, ncclCommShrink,
// ncclCommGetUniqueId, ncclCommGrow, over Communicator::revoke / shrink /
// grow / newUniqueId (core/engine/communicator_ft.cc).
//
// Semantics as NCCL documents them: only the surviving ranks call
// ncclCommShrink (an excluded rank that calls it gets ncclInvalidArgument);
// NCCL_SHRINK_ABORT revokes the parent first so its pending operations fail
// instead of being waited for; the parent stays valid (destroy or abort it).
// ncclCommGrow: existing ranks pass their comm and rank -1 (the parent's rank 0
// the id from ncclCommGetUniqueId, the others NULL), joining ranks pass comm
// NULL, the id and their new rank. Shrink and grow honour the config (blocking
// or not) and ncclGroupStart/End like ncclCommSplit. Errors: ncclInvalidArgument
// for bad arguments, the core error's code otherwise (a revoked communicator's
// operations return ncclRemoteError).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings/nccl/nccl_export.h"
#include "bindings/nccl/nccl_internal.h"
#include "bootstrap/bootstrap.h"

using namespace harp;
using namespace harp::nccl;

namespace {

ncclComm* childOf(const ncclCommImpl* parent) {
  auto* n = new ncclComm;
  n->cuda_dev = parent->cuda_dev;
  n->blocking = parent->blocking;
  n->net_name = parent->net_name;
  n->timeout_s = parent->timeout_s;
  return n;
}

}  // namespace

HARP_NCCL_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommRevoke: comm is NULL or not a HARP communicator");
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags must be NCCL_REVOKE_DEFAULT (0), got " +
                                         std::to_string(revokeFlags));
  if (ncclResult_t r = ensureReady(c); r != ncclSuccess) return r;
  c->comm->revoke();
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))

HARP_NCCL_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                              ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  HARP_NCCL_ENTER();
  ncclCommImpl* c = impl(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommShrink: comm is NULL or not a HARP communicator");
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  *newcomm = nullptr;
  if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
    return fail(ncclInvalidArgument, "ncclCommShrink: excludeRanksList is NULL or excludeRanksCount (" +
                                         std::to_string(excludeRanksCount) + ") is negative");
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
    return fail(ncclInvalidArgument, "ncclCommShrink: shrinkFlags must be NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT, got " +
                                         std::to_string(shrinkFlags));
  if (ncclResult_t r = ensureReady(c); r != ncclSuccess) return r;
  std::vector<int> ex(excludeRanksList, excludeRanksList + excludeRanksCount);
  for (int r : ex)
    if (r < 0 || r >= c->nranks)
      return fail(ncclInvalidArgument, "ncclCommShrink: excluded rank " + std::to_string(r) + " is out of range [0, " +
                                           std::to_string(c->nranks) + ")");
  if (shrinkFlags == NCCL_SHRINK_ABORT) c->comm->revoke();  // pending operations fail now
  c->engine.drain();
  auto parent = c->comm;
  ncclComm* n = childOf(c);
  auto make = [parent, n, ex]() -> std::shared_ptr<Communicator> {
    auto nc = parent->shrink(&ex);
    n->rank = nc->rank();
    n->nranks = nc->size();
    return nc;
  };
  return createDerived(newcomm, n, make, config, "ncclCommShrink", false);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommShrink,
                (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                 ncclConfig_t* config, int shrinkFlags))

HARP_NCCL_EXPORT ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  HARP_NCCL_ENTER();
  if (!impl(comm)) return fail(ncclInvalidArgument, "ncclCommGetUniqueId: comm is NULL or not a HARP communicator");
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclCommGetUniqueId: uniqueId is NULL");
  try {
    UniqueId id = Communicator::newUniqueId();
    static_assert(sizeof uniqueId->internal == sizeof id.bytes, "ncclUniqueId is 128 bytes");
    std::memcpy(uniqueId->internal, id.bytes.data(), id.bytes.size());
  } catch (const std::exception& e) {
    return fail(resultOf(e), std::string("ncclCommGetUniqueId: ") + e.what());
  }
  return ncclSuccess;
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId* uniqueId))

HARP_NCCL_EXPORT ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                            ncclComm_t* newcomm, ncclConfig_t* config) {
  HARP_NCCL_ENTER();
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommGrow: newcomm is NULL");
  *newcomm = nullptr;
  std::shared_ptr<UniqueId> uid;
  try {
    if (uniqueId) uid = std::make_shared<UniqueId>(UniqueId::fromBytes(uniqueId->internal, sizeof uniqueId->internal));
  } catch (const std::exception& e) {
    return fail(ncclInvalidArgument, std::string("ncclCommGrow: ") + e.what() + " (use ncclCommGetUniqueId)");
  }
  if (comm) {  // an existing rank: keeps its number
    ncclCommImpl* c = impl(comm);
    if (!c) return fail(ncclInvalidArgument, "ncclCommGrow: comm is not a HARP communicator");
    if (rank != -1) return fail(ncclInvalidArgument, "ncclCommGrow: existing ranks pass rank -1, got " + std::to_string(rank));
    if (ncclResult_t r = ensureReady(c); r != ncclSuccess) return r;
    if (nRanks <= c->nranks)
      return fail(ncclInvalidArgument, "ncclCommGrow: nRanks " + std::to_string(nRanks) + " must exceed the current " +
                                           std::to_string(c->nranks));
    if (c->rank == 0 && !uid)
      return fail(ncclInvalidArgument, "ncclCommGrow: rank 0 of the parent must pass the id from ncclCommGetUniqueId");
    c->engine.drain();
    auto parent = c->comm;
    ncclComm* n = childOf(c);
    n->rank = c->rank;
    n->nranks = nRanks;
    auto make = [parent, uid, nRanks] { return parent->grow(nRanks, uid.get()); };
    return createDerived(newcomm, n, make, config, "ncclCommGrow", false);
  }
  if (!uid) return fail(ncclInvalidArgument, "ncclCommGrow: a joining rank (comm NULL) must pass the unique id");
  if (nRanks < 1 || rank < 0 || rank >= nRanks)
    return fail(ncclInvalidArgument, "ncclCommGrow: rank " + std::to_string(rank) + " is out of range for nRanks " +
                                         std::to_string(nRanks));
  auto* n = new ncclComm;
  n->rank = rank;
  n->nranks = nRanks;
  auto make = [n, uid, rank, nRanks] {
    CommOptions o;
    o.transport = n->net_name;
    o.timeout_s = n->timeout_s;
    return Communicator::create(*uid, rank, nRanks, o);
  };
  return createDerived(newcomm, n, make, config, "ncclCommGrow", true);
}
HARP_NCCL_ALIAS(ncclResult_t, ncclCommGrow,
                (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                 ncclConfig_t* config))
