// bootstrap/bootstrap.h — unique ids and the rank-discovery step.
//
// A UniqueId is 128 opaque bytes (NCCL's ncclUniqueId size) that one process
// creates and hands to every rank out of band (an environment variable, a
// broadcast through MPI, a file). It carries the root's store address and a
// random 32-byte secret; the store and the transports authenticate every
// connection with a challenge-response keyed by (a key derived from) that
// secret (bootstrap/crypto.h), so a stray or hostile connection is refused and
// logged, and the secret itself never travels. Treat a unique id like a
// password. It serves one communicator (bootstrap/rendezvous.h).
//
// Layout (little-endian): "HARPUID1" | u16 family | u16 port | 16 B address |
// 32 B secret | u8 listening | reserved zeros. `listening` = 1: the id comes
// from createUniqueId, whose store listened before the id existed, so a store
// that refuses connections has retired (its communicator formed and every rank
// let go) or its process exited: Communicator::create says so within seconds
// instead of retrying until the timeout.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "bootstrap/store.h"

namespace harp {

struct UniqueId {
  std::array<unsigned char, 128> bytes{};
  SockAddr address() const;
  std::string secret() const;
  std::string hex() const;
  static UniqueId fromHex(const std::string& hex);
  static UniqueId fromBytes(const void* p, size_t n);
  static UniqueId make(const SockAddr& addr, const std::string& secret);
  static constexpr size_t kListeningByte = 60;
  bool listening() const { return bytes[kListeningByte] == 1; }
};

// Create a unique id whose store server runs in this process (NCCL's
// ncclGetUniqueId model). `bind` empty = the default interface, port 0.
UniqueId createUniqueId(const std::string& bind = "");

// Start (once per address+secret) a store server in this process. Used by rank
// 0 when ranks agree on an address instead of exchanging a unique id.
void ensureStoreServer(const SockAddr& addr, const std::string& secret);

// Lifetime of the store behind a unique id made here (TcpStoreServer has the
// details): it serves while anything may still rendezvous through it, and
// then releases its thread, port and descriptors:
//   * it stops by itself once the communicator it served formed and every
//     rank disconnected (destroyed its communicator, or exited); while any
//     rank stays connected it keeps serving, so split/shrink/grow/agree work
//     for the communicator's whole life, whatever became of the id;
//   * dropUniqueId(id): the id's owner let go of it (the Python UniqueId
//     object was collected): the store stops now if no rank is connected,
//     else once the last one disconnects. Ranks that try the id afterwards
//     are refused within seconds ("retired"). So keep the id until every
//     rank has joined (harp.Communicator / init returned); NCCL's ids work
//     alike (ncclGetUniqueId's root lives until the ranks have joined);
//   * releaseStoreServer(id) stops it now, clients or not (an id that will
//     not be used); false if this process runs none for it.
// Ids made with ncclGetUniqueId / createUniqueId and never used or dropped
// keep their store until the process exits. storeServersRunning counts this
// process's live servers.
bool dropUniqueId(const UniqueId& id);
bool releaseStoreServer(const UniqueId& id);
int storeServersRunning();

// Random bytes from the kernel.
std::string randomBytes(size_t n);
// 64-bit FNV-1a, used to derive tokens and ids from the secret.
uint64_t hash64(const std::string& s, uint64_t seed = 0);

// Facts about this process that peers need to pick a transport.
//
// host_id is the claim "ranks with equal keys share memory": the kernel's boot
// id together with the inodes of this process's network, IPC and mount
// namespaces (/proc/self/ns/*), so two containers or two `harp-cluster` hosts
// on one kernel differ (their /dev/shm and SysV IPC differ) while processes of
// one container agree. HARP_HOSTID=KEY replaces the whole key ("hostid:KEY"):
// tests fake several hosts on one machine with it, and sites whose namespaces
// are arranged otherwise state the truth. A claim is only a claim:
// confirmHostIds() checks it with a shared-memory probe before a transport
// relies on it.
struct HostIdentity {
  std::string host_id;   // boot id + net/ipc namespaces + /dev/shm's device, or "hostid:" + HARP_HOSTID
  std::string hostname;
  int pid;
};
HostIdentity thisHost();

// Collective over `store` (every rank calls it with the same keys and size):
// confirms the claimed host ids by an actual shared-memory probe. For every
// group of ranks claiming one key, the group's lowest rank creates a /dev/shm
// object holding a random 32-byte nonce and publishes its name and the nonce
// through the store; the others open it and compare. A rank that cannot see
// the object, or sees other bytes, is another host: its key becomes
// "<claim>/probe-failed/r<rank>" (logged at WARN), so no transport assumes
// shared memory with it. Returns the confirmed keys, the same on every rank
// (one more store round: each rank publishes its confirmed key). The probe
// object is unlinked before returning. Store keys used: `prefix` + "probe/*"
// and "hostok/*".
std::vector<std::string> confirmHostIds(Store& store, const std::string& prefix, int rank,
                                        const std::vector<std::string>& claimed, double timeout_s);

// Length-prefixed lists of blobs, for records exchanged through the store;
// unpackBlobs throws harp::Error (kInternal) on a cut or overlong length.
std::string packBlobs(const std::vector<std::string>& v);
std::vector<std::string> unpackBlobs(const std::string& s);

// Everyone publishes a blob; everyone gets all blobs (through the store). From
// HARP_STORE_GATHER_RANKS ranks the blobs go through rank 0 (3p - 2 requests).
std::vector<std::string> storeAllgather(Store& store, const std::string& key, int rank, int size,
                                        const std::string& mine, double timeout_s);

}  // namespace harp
