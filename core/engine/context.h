// core/engine/context.h — what an algorithm sees while it runs one collective.
//
// A Context wraps the communicator's pairs for the duration of one collective:
// algorithms post isend/irecv to peer ranks and wait; the Context tags every
// message with the collective's descriptor (so ranks that disagree find out),
// drives the transports' progress, enforces the timeout, and turns transport
// failures into harp::Error with the peer named.
//
// Waiting policy: poll the transports, spin briefly, then sched_yield, then
// block in the transport's wait() — never burn a core when ranks outnumber
// cores. Waits on more than HARP_SPIN_BYTES pending bytes poll once and block:
// they last far longer than a wake-up.
//
// Descriptor check: the tag carries the descriptor exactly only while root <
// 4096 and count < 2^32, and a rank that only sends (the root of a broadcast or
// scatter, a leaf of gather/reduce) compares nothing. For rooted collectives,
// zero counts and descriptors the tag cannot carry, runCollective() adds an
// exact check: startCheck() sends this rank's full Descriptor to its peers
// before any data (so the per-pair FIFO order is the same on every rank) and
// finishCheck() compares what arrived; waitAll() compares arrivals as they
// come, so a rank blocked on data that a disagreeing root never sends still
// raises MismatchError. CheckShape drops the messages the data already
// carries (exact tag, flat algorithm on this communicator's pairs, and the
// shape the algorithm declares safe for its message pattern:
// AlgorithmSpec::root_check, core/algorithms/algorithm.h):
//   kFromRoot (broadcast, scatter): the root sends no descriptor; a rank's
//     data, forwarded only by ranks whose tags matched, vouches for the root.
//   kToRoot (gather, whose leaves send straight to the root: gather linear):
//     nobody sends the root a descriptor; each leaf's data, compared there,
//     vouches for it. A tree gather (gather binomial) keeps kAll: an inner
//     rank waiting for a child that names another root would hang.
// Every rank still hears (directly or through such data) from every rank in
// the same call. Where data vouches for the root or a rank only sends data (the
// root of a broadcast or scatter, the non-roots of a reduce or gather, and a
// broadcast or scatter receiver: kFromRoot), the rank does not wait for its
// peers' descriptors: startCheck(..., defer) posts those receives in a
// DeferredCheck (core/engine/communicator.h), compared as they arrive while this and
// later calls wait; a receiver still raises in the call for any that came
// while it waited for data (so one blocked on data that a rank with another
// idea of the root never sends raises). settleDeferred(), at each call's end,
// waits for the open ones when the call did not defer its own check, and
// otherwise only for those beyond HARP_CHECK_WINDOW (1-64, default 32) open
// calls; destroy() waits for the rest. A disagreement found there raises
// MismatchError naming the earlier call. So a loop of small broadcasts
// pipelines: the root's call k+32 needs only that every peer has started call
// k+15. Cost: each receiver sends its 24-byte descriptor to every peer, as a
// lazy send (tcp: 16 in one write) that nobody waits for, and the deferred
// receives are lazy too (tcp reads them in bursts, at waits); a call that
// defers needs no closing abort-notice poll (bench/RESULTS.md, "Deferred
// root check" and "Batched descriptors").
//
// Lifetime: built by the communicator for one collective, on its executing
// thread, from the CommResources it owns (the connections and reused buffers,
// core/engine/communicator.h); the Context neither owns nor outlives them.
//
// Single-threaded: used only by the thread running the collective.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <initializer_list>
#include <vector>

#include "core/engine/call.h"
#include "core/engine/resources.h"
#include "core/topology/topology.h"
#include "bootstrap/socket.h"
#include "transport/transport.h"

namespace harp {

using transport::Request;

// What an earlier call's deferred descriptor check found (a disagreement:
// kMismatch; or that call's failure), raised at a later call or destroy():
// its text names "rank r's earlier call #k". The communicator tells it from
// the later call's own failures by type, not by its words.
class DeferredCheckError : public Error {
 public:
  using Error::Error;
};

class Context {
 public:
  Context(CommResources& res, int rank, int size, const CollArgs& args, uint64_t tag, double timeout_s);
  // A collective that ends with requests still pending (an exception on its
  // way out, before any abort reached the transport) aborts their transports
  // here, while the requests still exist: a transport must never keep a
  // pointer to a request that outlived its Context (a later abort from the
  // keep-alive thread would write to freed memory).
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CollArgs& args() const { return args_; }
  size_t elemSize() const { return esize_; }

  Request* isend(int peer, const void* buf, size_t bytes);
  Request* irecv(int peer, void* buf, size_t bytes);
  // The same with an explicit message tag instead of the collective's (p2p_batch:
  // each message carries the tag a single send/recv of its size would).
  // lazy: Request::lazy (transport.h), for messages nobody waits for in this call.
  Request* isend(int peer, const void* buf, size_t bytes, uint64_t tag, bool lazy = false);
  Request* irecv(int peer, void* buf, size_t bytes, uint64_t tag);
  void wait(Request* r);
  void waitAll(std::initializer_list<Request*> rs);
  void waitAll(const std::vector<Request*>& rs);
  // Post both, wait for both.
  void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes);

  // Communicator-owned scratch space, at least `bytes`, reused across calls.
  void* scratch(size_t bytes);
  // Pipelining segment size in bytes (HARP_SEGMENT_BYTES, default 512K).
  size_t segmentBytes() const;

  // For algorithms a transport hosts (e.g. transport/shm/allreduce_shm.cc,
  // which asks it for its collective area with transport::capabilityOf): the
  // transport serving `peer` (nullptr for this rank), this collective's tag
  // and timeout.
  transport::Transport* transportOf(int peer) const;
  uint64_t tag() const { return tag_; }
  double timeout() const { return timeout_s_; }

  // State an algorithm keeps between its calls on this communicator (e.g.
  // allreduce ring_weighted's measured link rates): one T per key (an address
  // of the algorithm's own), value-initialised on first use, freed with the
  // communicator (a split or shrunk communicator starts without). Every rank
  // must change it alike, from data all ranks share, or their next calls
  // disagree (the descriptor check then names the call).
  template <class T>
  T& algorithmState(const void* key) {
    std::shared_ptr<void>& s = res_.algo_state[key];
    if (!s) s = std::make_shared<T>();
    return *static_cast<T*>(s.get());
  }

  // Topology: the intra-host and rail sub-communicators of this
  // collective's communicator (core/topology/topology.h), created collectively on the
  // first call. Hierarchical algorithms run their legs on them.
  SubComms& subComms();

  // Exact descriptor check (see the top of this file). defer: this rank's
  // descriptor receives go to a new DeferredCheck, compared as they arrive
  // while this call waits and completed by its next call: a rank that only
  // sends, and (kFromRoot) a receiver, whose data vouches for the root.
  enum class CheckShape : uint8_t { kAll, kFromRoot, kToRoot };
  void startCheck(const Descriptor& mine, CheckShape shape = CheckShape::kAll, bool defer = false);
  void finishCheck();
  // Waits for the DeferredChecks that were open when this Context was made
  // (earlier calls'), compares them and closes them; MismatchError names the
  // earlier call and every rank that disagreed.
  void settleDeferred();
  // In a call that is failing: the MismatchError text an earlier call's open
  // deferred check shows after one round of progress ("" if none).
  std::string deferredFinding();
  // This call deferred its check and hears from every peer in it (their
  // descriptors, or the root's data): its later check stands for the
  // closing abort-notice poll (Communicator::closingCheck).
  bool hearsFromAll() const { return hears_all_; }

 private:
  void check(Request* r);
  bool checksPending() const { return check_done_ < check_recvs_.size() || settle_n_ > 0 || open_dc_; }
  void compareChecks();
  // True: all arrived and agree. partial: name the disagreements among those
  // that arrived, even if others have not (false if none).
  bool compareDeferred(DeferredCheck& dc, bool partial = false);
  CommResources& res_;
  const CollArgs& args_;
  uint64_t tag_;
  double timeout_s_;
  int rank_, size_;
  size_t esize_;
  // Made on the first isend/irecv: a default std::deque allocates twice, and algorithms that only use
  // shared memory (allreduce shm) post no requests (2 fewer mallocs and frees per call).
  std::optional<std::deque<Request>> reqs_;
  // Descriptor check: peers' descriptors (comm-owned buffer) and their receives.
  const Descriptor* check_mine_ = nullptr;
  std::vector<Request*> check_recvs_, check_sends_;
  size_t check_done_ = 0;  // check_recvs_[0, check_done_) compared
  int settle_n_;           // res_.deferred sets older than this call, still open
  // This call's own DeferredCheck where this rank also receives data: compared
  // (as far as arrived) while the call waits, left open at its end.
  DeferredCheck* open_dc_ = nullptr;
  bool opened_ = false;  // this call deferred its own check
  bool hears_all_ = false;  // ... and hears from every peer in it (see startCheck)
};

std::string describe(const Descriptor& d);

// Tag layout: seq(4) | algo(4) | coll(4) | dtype(4) | op(4) | root(12) | count(32)
// (algo: the algorithm's index in its collective, core/algorithms/registry.h).
// Exact while root < 4096 and count < 2^32 (tagIsExact); beyond that the
// descriptor check carries what the tag cannot. p2p messages (makeP2pTag):
// coll = send, dtype, and the whole 32-bit user tag in the low 32 bits (the
// count is checked through the message length); seq, algo, op, root are 0.
// The descriptor check's own messages have coll = 0xf.
uint64_t makeTag(uint32_t seq, CollType c, DataType dt, ReduceOp op, int root, uint64_t count, unsigned algo = 0);
uint64_t makeP2pTag(DataType dt, uint32_t user_tag);
uint64_t makeCheckTag(uint32_t seq);  // the descriptor check's messages
inline bool tagIsExact(int64_t root, uint64_t count) { return root >= 0 && root < 4096 && count < (1ull << 32); }
std::string describeTag(uint64_t tag);

// Split `count` elements into `n` blocks as evenly as possible (the first
// count % n blocks get one more). Used by every block-partitioned algorithm.
struct Blocks {
  size_t count, n;
  size_t size(size_t i) const { return count / n + (i < count % n ? 1 : 0); }
  size_t offset(size_t i) const { return i * (count / n) + (i < count % n ? i : count % n); }
};

}  // namespace harp
