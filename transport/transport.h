// transport/transport.h — the one interface every HARP transport implements.
//
// A Transport moves tagged byte ranges between the ranks of one communicator.
// The core never touches sockets, rings, queue pairs or mbufs; it posts
// Requests on Pairs and waits for them. Everything a collective needs is:
//
//   * Transport::localAddress(peer)  — an opaque blob this rank publishes for
//     `peer` through the bootstrap (a listen address, a MAC, a QP number...).
//   * Transport::connect(...)       — given every peer's blob for us, build one
//     Pair per peer this transport was chosen for.
//   * Pair::isend / Pair::irecv      — non-blocking, completion in the Request.
//   * Transport::progress / wait     — move bytes; block when nothing moves.
//   * Transport::capability          — optional services (beyond messages) a
//     transport offers to the algorithms it hosts; see capabilityOf below.
//
// Matching rules (every transport must keep them):
//   * Per pair and direction, messages are matched strictly in posting order:
//     the k-th isend on rank A's pair to B matches the k-th irecv on B's pair
//     to A. There is no wildcard and no reordering.
//   * Each message carries a 64-bit tag and its length. A receiver whose
//     posted tag or length differs from the incoming one fails the request with
//     Request::kMismatch and records what arrived (peer_tag, peer_len); it never
//     writes past the posted buffer. The core encodes the collective descriptor
//     (kind, dtype, op, root, count, sequence) in the tag, so this is how ranks
//     that disagree about a collective find out, on every transport.
//   * A failure of the connection (peer died, EOF, abort notice from the peer)
//     fails every pending request of that pair with kPeerFailure and a message
//     naming the peer rank; later posts on the pair fail at once.
//
// Threading: a Transport and its Pairs are driven by one thread at a time (the
// communicator's executing thread). Nothing here is internally locked, except
// abort(), which may be called from any thread.
//
// Progress: a transport must not spin a CPU when it has nothing to do — ranks
// often outnumber cores. progress() is a non-blocking attempt; wait() blocks
// (poll(2), futex, completion channel, or a polling back-off) until something
// may have happened or the timeout passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/types.h"

namespace harp::transport {

// One posted send or receive. Owned by the caller, who keeps it (and the
// buffer) alive until done() is true. Transports may use the private fields.
constexpr int kMaxLazyHeld = 16;  // Request::lazy: sends a transport holds per connection at most

struct Request {
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };
  enum Failure : int { kNone = 0, kMismatch = 1, kPeerFailure = 2, kLocal = 3 };

  void* buf = nullptr;  // send: source bytes (not modified); recv: destination
  size_t len = 0;
  uint64_t tag = 0;
  int peer = -1;  // communicator rank of the other side (set by the core)

  State state = kPending;
  Failure failure = kNone;
  std::string error;       // human text for kPeerFailure / kLocal
  uint64_t peer_tag = 0;   // kMismatch: what the sender tagged
  uint64_t peer_len = 0;   // kMismatch: how long the sender's message was
  // Send: the sender waits for nobody on this message and it need not
  // leave now; a transport may hold it (with the pair's later messages, in
  // order) until Transport::flush(), its next unhinted send on that pair, a
  // wait() that lasts over a millisecond, or kMaxLazyHeld lazy sends on one
  // connection (tcp: copies it and completes the request at once, then
  // writes the held frames in one sendmsg).
  // Receive: nobody waits for it now; progress() may leave its bytes in the
  // kernel while only lazy receives are posted on the pair, but wait() still
  // reads them (tcp). The caller clears it before it waits for the request.
  // A hint: a transport may ignore it.
  bool lazy = false;

  // Transport-private progress state.
  size_t offset = 0;
  void* tp_private = nullptr;
  uint64_t tp_word = 0;

  bool done() const { return state != kPending; }
  void complete() { state = kDone; }
  void fail(Failure f, std::string why) {
    failure = f;
    error = std::move(why);
    state = kFailed;
  }
};

class Pair {
 public:
  virtual ~Pair() = default;
  // Post a send of [r.buf, r.buf + r.len) with r.tag. Never blocks.
  virtual void isend(Request* r) = 0;
  // Post a receive into [r.buf, r.buf + r.len), expecting r.tag. Never blocks.
  virtual void irecv(Request* r) = 0;
};

// What a transport learns about the communicator it serves.
struct CommInfo {
  int rank = 0;
  int size = 1;
  uint64_t comm_id = 0;       // unique per communicator instance in the job
  std::string token;          // random per-communicator secret drawn by rank 0 and read from the
                              // authenticated store; any length. Never sent: it keys the
                              // challenge-response (transport/common/handshake.h) of every connection
  double timeout_s = 300.0;   // bound for any blocking step in setup
  std::string bind_hint;      // IP of the local interface that reaches the bootstrap
                              // root; socket transports listen there by default
};

// Per-rank facts published by the bootstrap, available to every transport.
struct PeerInfo {
  int rank = 0;
  std::string host_id;   // equal on ranks that share a host (boot id + net ns)
  std::string hostname;
  int pid = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;

  // Blob to publish for `peer` (called for every peer this rank may talk to,
  // before connect). Most transports return the same blob for all peers.
  virtual std::string localAddress(int peer) = 0;

  // Connect to `peers` (ranks this transport was chosen for). remote[i] is the
  // blob peers[i] published for this rank. Blocks until all pairs are up or
  // CommInfo::timeout_s passes (throws harp::Error naming the peer).
  virtual void connect(const std::vector<int>& peers, const std::vector<std::string>& remote) = 0;

  // The pair to `peer` (must be one passed to connect).
  virtual Pair* pair(int peer) = 0;

  // Non-blocking attempt to move bytes on every pair. True if anything moved
  // or completed. Also detects peer failure and incoming abort notices.
  virtual bool progress() = 0;

  // Block up to timeout_ms until progress() may have something to do.
  virtual void wait(int timeout_ms) = 0;

  // Send now what lazy sends (Request::lazy) left held. Called before the
  // executing thread blocks or yields, and from the keep-alive thread (any
  // thread; must not block). The default holds nothing.
  virtual void flush() {}

  // Tell every connected peer this communicator is broken (best effort, never
  // blocks long), then fail all pending requests with `why`. Any thread.
  virtual void abort(const std::string& why) = 0;

  // Closing check after a collective (non-blocking; may read a socket): the
  // text of an abort notice a peer has sent, naming that peer, or "" when none
  // has arrived. A collective whose data all arrived still fails when a peer
  // aborted meanwhile, so no rank completes a collective after a peer's
  // abort() has reached it. The default reports nothing.
  virtual std::string abortNotice() { return ""; }

  // Optional: pin/register user memory for repeated use (RDMA, DPDK external
  // buffers). The default does nothing; transports with a registration cache
  // register lazily on first use anyway.
  virtual void registerMemory(void* /*p*/, size_t /*n*/) {}
  virtual void deregisterMemory(void* /*p*/) {}

  // Capabilities: services beyond moving messages that a transport offers to
  // the algorithms it hosts (an algorithm file in the transport's own folder,
  // see transport/README.md, "Hosting an algorithm"). The engine never needs
  // to know a transport's class: an algorithm asks the Transport* its Context
  // gives it (Context::transportOf) with capabilityOf<C>(t), where C is a type
  // the offering transport declares with a `static const Capability
  // kCapability` member. The answer is the object implementing C, or nullptr
  // when this transport does not offer it (the default). Asking costs one
  // virtual call and a pointer compare (a capability is known by the address
  // of its Capability object, not by its name), so an algorithm may ask per
  // call. Lifetime: the object belongs to the transport and lives as long as
  // it. Threading: the transport's (the communicator's executing thread).
  struct Capability {
    const char* name;  // for messages and logs only
  };
  virtual void* capability(const Capability& /*which*/) { return nullptr; }
};

// A capability any transport may offer (tcp does): how this rank is connected
// to a peer, for the status tools (the job view, core/observe/jobview.h).
// Unlike the others it is asked from any thread (the observer's) once
// connect() returned, while the executing thread drives the transport, so an
// implementation reads only what is atomic or fixed after connect().
struct LinkStatus {
  static const Transport::Capability kCapability;
  enum State : int { kUp = 0, kNotYet = 1, kFailed = 2 };  // kNotYet: lazy set-up, not connected yet
  struct Link {
    State state = kUp;
    int lanes = 1;  // connections to the peer (tcp: lanes), open or (kNotYet) to be opened
  };
  virtual Link link(int peer) const = 0;

 protected:
  ~LinkStatus() = default;
};

// Typed accessor for Transport::capability (t may be nullptr).
template <class C>
C* capabilityOf(Transport* t) {
  return t ? static_cast<C*>(t->capability(C::kCapability)) : nullptr;
}

// ---------------------------------------------------------------------------
// Registry. Each transport's folder registers itself with one line:
//   HARP_REGISTER_TRANSPORT(spec_expr)
// and is listed in transport/CMakeLists.txt. Built-in transports (tcp, shm)
// register when libharp.so loads. In an optional transport's runtime module
// (compiled with HARP_TRANSPORT_MODULE) the same line defines the module's one
// exported C symbol, harp_transport_register(abi), which transport/registry.cc
// calls after dlopen. The communicator picks, per peer, the available
// transport of highest priority whose `reachable` says yes (shared memory for
// a peer on the same host, TCP for the rest), unless HARP_TRANSPORT names one.
struct TransportSpec {
  std::string name;
  int priority = 0;
  // Why this transport cannot run in this process ("" = it can). Called once.
  std::function<std::string()> unavailable;
  // Can `self` reach `peer` with this transport (e.g. same host for shm)?
  std::function<bool(const PeerInfo& self, const PeerInfo& peer)> reachable;
  std::function<std::unique_ptr<Transport>(const CommInfo&, const std::vector<PeerInfo>&)> create;
};

int registerTransport(TransportSpec spec);
// Every transport: the built-in ones, then one entry per optional module —
// loaded, or a placeholder whose unavailable() says why it is not (module not
// built, or dlopen failed: the dlerror text). Modules are loaded on the first
// call; thread-safe.
const std::vector<TransportSpec>& registeredTransports();
const TransportSpec* findTransport(const std::string& name);

// What became of each optional transport module (for harp-config).
struct ModuleStatus {
  std::string name;
  std::string path;   // where it was looked for (next to libharp.so)
  bool loaded = false;
  std::string error;  // why not loaded ("" when loaded)
};
const std::vector<ModuleStatus>& transportModules();

// Bumped whenever TransportSpec or Transport change layout; a module built for
// another value is refused with a message saying so.
#define HARP_TRANSPORT_ABI 2

#define HARP_REGISTER_TRANSPORT_CONCAT2(a, b) a##b
#define HARP_REGISTER_TRANSPORT_CONCAT(a, b) HARP_REGISTER_TRANSPORT_CONCAT2(a, b)
#ifdef HARP_TRANSPORT_MODULE
#define HARP_REGISTER_TRANSPORT(spec_expr)                                                  \
  extern "C" __attribute__((visibility("default"))) int harp_transport_register(int abi) { \
    if (abi != HARP_TRANSPORT_ABI) return HARP_TRANSPORT_ABI;                              \
    ::harp::transport::registerTransport(spec_expr);                                       \
    return 0;                                                                              \
  }
#else
#define HARP_REGISTER_TRANSPORT(spec_expr)                                            \
  static const int HARP_REGISTER_TRANSPORT_CONCAT(harp_transport_reg_, __LINE__) = \
      ::harp::transport::registerTransport(spec_expr)
#endif

}  // namespace harp::transport
