// core/engine/communicator.cc — a communicator's lifecycle: creation (the
// connections are core/engine/connect.cc), breaking and destroying it, and the
// convenience wrappers. The call itself: core/engine/executor.cc (where it
// runs), core/engine/validate.cc and core/engine/pipeline.cc (its stages).
#include "core/engine/communicator.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <unistd.h>

#include "base/env.h"
#include "base/log.h"
#include "bootstrap/crypto.h"
#include "bootstrap/rendezvous.h"
#include "core/engine/context.h"
#include "core/ft/keepalive.h"

namespace harp {
namespace {

// CommOptions::timeout_s < 0: HARP_TIMEOUT or 300 s; otherwise a positive
// number of seconds. inf and huge values saturate at kForeverS (~31 years), so
// every conversion downstream (ms, ns, int seconds in messages) stays in range.
double resolveTimeout(double given) {
  double t = given < 0 ? env::timeout("HARP_TIMEOUT") : env::checkTimeout(given, "timeout");
  return std::min(t, kForeverS);
}

}  // namespace

// ---------------------------------------------------------------------------
// Creation

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, CommOptions opts)
    : store_(std::move(store)), made_in_(forkGeneration()), rank_(rank), size_(size), opts_(std::move(opts)) {
  timeout_s_ = resolveTimeout(opts_.timeout_s);
  tuning_ = TuningTable::fromEnvironment();
  calibration_ = Calibration::fromEnvironment();
  res_.spin = static_cast<int>(std::max<long long>(1, env::integer("HARP_SPIN")));
  res_.spin_bytes = env::bytes("HARP_SPIN_BYTES");
  res_.segment_bytes = std::max<size_t>(env::bytes("HARP_SEGMENT_BYTES"), 4096);
  res_.scratch_keep = env::bytes("HARP_SCRATCH_KEEP_BYTES");
  res_.check_window = static_cast<int>(std::clamp<long long>(env::integer("HARP_CHECK_WINDOW"), 1, 64));
  res_.deferred.resize(res_.check_window + 1);
  res_.owner = this;                       // Topology
  hier_auto_ = env::flag("HARP_HIER");
}

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommOptions opts) {
  if (!store) throw InvalidArgument("no store given");
  env::warnUnknownVariables();  // once per process: misspelt HARP_* variables (base/params.def)
  double timeout = resolveTimeout(opts.timeout_s);
  // Check in first: a bad rank/size, a duplicate or a missing rank is
  // reported to every rank through the store (bootstrap/rendezvous.h).
  rendezvous(*store, rank, size, timeout);
  try {
    std::shared_ptr<Communicator> c(new Communicator(store, rank, size, std::move(opts)));
    c->connectAll();
    rendezvousDone(*store);
    c->attachRecorder();  // flight recorder
    return c;
  } catch (const Error& e) {
    postRendezvousError(*store, e.kind() == Error::kInvalidArgument ? Error::kPeerFailure : e.kind(),
                        describeRank(rank) + " failed to create the communicator: " + e.what());
    throw;
  } catch (const std::exception& e) {
    postRendezvousError(*store, Error::kPeerFailure, describeRank(rank) + " failed to create the communicator: " +
                                                         e.what());
    throw;
  }
}

// Refusals that mean a unique id's store has retired (a live store under load
// delays a connection; it does not refuse one).
constexpr double kRetiredStoreS = 3;

// A unique id serves one communicator: its store retires once that
// communicator formed and every rank let go, so a reused id finds nothing
// listening (bootstrap/bootstrap.h, UniqueId::listening).
std::shared_ptr<Communicator> Communicator::create(const UniqueId& id, int rank, int size, CommOptions opts) {
  double t = resolveTimeout(opts.timeout_s);
  std::shared_ptr<TcpStore> store;
  try {
    store = std::make_shared<TcpStore>(id.address(), id.secret(), t, id.listening() ? kRetiredStoreS : -1);
  } catch (const Error& e) {
    if (!id.listening() || std::strstr(e.what(), "nothing listens") == nullptr) throw;
    throw InvalidArgument(describeRank(rank) + ": unique id already used, or its creator exited: its store at " +
                          id.address().str() + " has retired (" + e.what() + "). A unique id serves one "
                          "communicator; create a new one (harp.get_unique_id(), ncclGetUniqueId) for each");
  }
  return create(std::make_shared<PrefixStore>(store, "c/"), rank, size, std::move(opts));
}

Communicator::~Communicator() {
  try {
    destroy();
  } catch (...) {
  }
}

std::string Communicator::payloadMac(const std::string& label, const std::string& msg) const {
  std::string bound(reinterpret_cast<const char*>(&comm_id_), sizeof comm_id_);
  return crypto::hmacSha256(crypto::deriveKey(token_, "payload|" + label), bound + msg);
}

std::string Communicator::transportName(int peer) const {
  if (peer < 0 || peer >= size_) throw InvalidArgument("peer " + std::to_string(peer) + " out of range");
  if (peer == rank_) return "self";
  return res_.transport_of[peer] ? res_.transport_of[peer]->name() : "none";
}

// ---------------------------------------------------------------------------
// Breaking and destroying

void Communicator::markBroken(const std::string& why) {
  if (inheritedAcrossFork(made_in_)) return;  // the parent's connections: not ours to break
  {
    std::lock_guard<std::mutex> g(broken_mu_);
    if (broken_.load()) return;
    broken_reason_ = why;
    broken_kind_ = Error::kPeerFailure;
    if (why.find("mismatch") != std::string::npos) broken_kind_ = Error::kMismatch;
    if (why.find("timed out") != std::string::npos) broken_kind_ = Error::kTimeout;
    if (why.find(kRevokedMark) != std::string::npos) broken_kind_ = Error::kRevoked;
    broken_.store(true);
  }
  HARP_WARN("communicator broken: %s", why.c_str());
  recordFailure(why);  // flight-record dump (HARP_FR_DUMP_ON_FAILURE)
  // The notice says which collective this rank completed last, so a peer that
  // finishes that one as well keeps it (closingCheck): ranks agree on it.
  const uint64_t done = done_word_.fetch_or(1, std::memory_order_acq_rel) >> 1;
  // The kind goes first: transports may truncate the text (shm keeps ~180 bytes).
  const bool mismatch = broken_kind_ == Error::kMismatch;
  const std::string notice =
      "after collective #" + std::to_string(done) + ": " + (mismatch ? "collective mismatch: " : "") + why;
  for (auto& t : res_.transports) t->abort(notice);
  abortSubComms(notice);  // Topology: peers waiting in a sub-communicator learn it too
}

std::string Communicator::brokenReason() {
  std::lock_guard<std::mutex> g(broken_mu_);
  return broken_reason_;
}

void Communicator::abort(const std::string& reason) {
  refuseIfInherited("abort");
  markBroken("aborted by rank " + std::to_string(rank_) + ": " + reason);
}

void Communicator::refuseRooted(CollType c, const std::string& why) {
  if (size_ > 1 && collRooted(c))
    markBroken("rank " + std::to_string(rank_) + ", the root, refused its own " + collName(c) + " arguments: " + why);
}

void Communicator::refuseInherited(const char* what) const {
  throw InvalidArgument(std::string(what) + " on " + describeRank(rank_) + "'s communicator in process " +
                        std::to_string(::getpid()) + ", a fork of the process that created it: a communicator "
                        "cannot be used in a forked child (its connections are the parent's). Create one in the "
                        "child, or start children with the 'spawn' or 'forkserver' method");
}

// The child's copy of a communicator made before a fork: its threads are the
// parent's (joining one crashes), its sockets and shared memory are shared
// with the parent's copy (a goodbye, a shutdown or an abort notice would
// break the parent's job), and a lock a parent thread held at the fork stays
// held. So: no lock, no message, no join; everything that would tear
// something down is moved into a box that is never freed, and the child's
// exit releases its copies of the descriptors and mappings.
void Communicator::abandonInherited() {
  if (destroyed_) return;
  destroyed_ = true;
  struct Inherited {
    std::thread worker;
    std::unique_ptr<KeepAlive> keepalive;
    std::unique_ptr<SubComms> subs;
    std::vector<std::unique_ptr<transport::Transport>> transports;
    std::shared_ptr<Store> store;
    std::shared_ptr<obs::Recorder> recorder;
    std::shared_ptr<CompressEngine> compress;
  };
  // Leaked on purpose (see above); a std::thread moved out is no longer joinable here.
  new Inherited{std::move(worker_), std::move(keepalive_), std::move(subs_), std::move(res_.transports),
                std::move(store_), std::move(recorder_), std::move(compress_)};
  res_.pair_of.assign(size_, nullptr);
  res_.transport_of.assign(size_, nullptr);
}

void Communicator::destroy() {
  if (inheritedAcrossFork(made_in_)) return abandonInherited();
  {
    std::lock_guard<std::mutex> l(q_mu_);
    if (destroyed_) return;
    destroyed_ = true;
    stop_ = true;
  }
  stopKeepAlive();  // before the transports its callback aborts go
  q_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> ex(exec_mu_);
  // The last rooted call's deferred check (this rank only sent in it): the
  // error is raised once everything below is released.
  std::exception_ptr late;
  try {
    settleDeferred();
  } catch (...) {
    late = std::current_exception();
  }
  try {
    destroySubComms();  // Topology
  } catch (...) {
    if (!late) late = std::current_exception();
  }
  retireRecorder();  // off the process list, and lets go of the store
  store_.reset();  // closes a TcpStore connection now (the root may then retire)
  res_.transports.clear();
  res_.scratch.trim(0);
  res_.pair_of.assign(size_, nullptr);
  res_.transport_of.assign(size_, nullptr);
  res_.deferred_n = 0;
  if (late) std::rethrow_exception(late);
}

// destroy(): wait (up to the communicator's timeout) for the descriptors a
// deferred check still lacks and compare them; a broken communicator has
// reported its error already.
void Communicator::settleDeferred() {
  if (res_.deferred_n == 0 || broken_.load() || res_.transports.empty()) return;
  CollArgs a;
  const Descriptor& d = res_.deferred[res_.deferred_head].mine;
  a.coll = static_cast<CollType>(d.coll);
  try {
    Context ctx(res_, rank_, size_, a, makeCheckTag(d.seq), timeout_s_);
    ctx.settleDeferred();
  } catch (const Error& e) {
    markBroken(e.what());  // peers still waiting learn it too
    throw;
  }
}

// ---------------------------------------------------------------------------
// Convenience wrappers

std::shared_ptr<Work> Communicator::allreduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                                              CollOptions o, bool async) {
  CollArgs a;
  a.coll = CollType::kAllreduce;
  a.sendbuf = send;
  a.recvbuf = recv;
  a.count = count;
  a.dtype = dt;
  a.op = op;
  a.opts = std::move(o);
  return submit(std::move(a), async);
}

std::shared_ptr<Work> Communicator::allreduceCoalesced(std::vector<BufPiece> pieces, DataType dt, ReduceOp op,
                                                       CollOptions o, bool async) {
  CollArgs a;
  a.coll = CollType::kAllreduceCoalesced;
  size_t total = 0;
  for (const BufPiece& b : pieces) total += b.count;  // overflow: validate() names the piece
  a.count = total;
  a.pieces = std::move(pieces);
  a.dtype = dt;
  a.op = op;
  a.opts = std::move(o);
  return submit(std::move(a), async);
}

std::shared_ptr<Work> Communicator::broadcast(void* buf, size_t count, DataType dt, int root, CollOptions o,
                                              bool async) {
  CollArgs a;
  a.coll = CollType::kBroadcast;
  a.sendbuf = buf;
  a.recvbuf = buf;
  a.count = count;
  a.dtype = dt;
  a.root = root;
  a.opts = std::move(o);
  return submit(std::move(a), async);
}

std::shared_ptr<Work> Communicator::barrier(bool async) {
  CollArgs a;
  a.coll = CollType::kBarrier;
  return submit(std::move(a), async);
}

}  // namespace harp
