// transport/shm/shm_transport.h — the shared-memory transport (ranks on one
// host). Protocol and design: transport/shm/PROTOCOL.md.
//
//   * Every rank owns one segment (shm_segment.h) holding one SPSC ring per
//     local peer (messages peer -> owner) plus an area for intra-host
//     collectives. Segments travel as fds over an abstract unix socket, which
//     stays open to detect a dead peer (EOF).
//   * Messages up to HARP_SHM_CMA_BYTES (and all messages when CMA is not
//     permitted) are copied through the ring in slot-sized pieces, pipelined.
//     Larger ones are single-copy: the sender publishes (address, length) and
//     the receiver reads straight from the sender's memory with
//     process_vm_readv, then acknowledges.
//   * Waiting: the owner sets `sleeping` and blocks on its doorbell futex;
//     writers wake it only when that flag is set.
//
// Threading: one driving thread (the communicator's) calls everything except
// abort(), which may come from any thread; it only sets flags, writes the
// notice into the peers' segments and rings the doorbells.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"

namespace harp::transport::shm {

class ShmTransport;
struct Hello;  // shm_connect.cc: sent after the authenticated handshake

// Everything the peer writes into shared memory is read once into a local and
// checked before use: a slot header (SlotView, checkSlot), the consumed count
// of the ring we write (never back, never past what we wrote), the count of our
// single-copy messages it read (never back, never past what we posted), the
// single-copy address (its read must not wrap). A violation fails the pair
// with "shm protocol error from <peer>: <what>"; nothing past the header is
// read and nothing is written past the posted buffer.
struct SlotView {
  uint64_t tag = 0, len = 0;
  uint32_t kind = 0, nbytes = 0;
};
// What the receiver expects of the next slot: a message start (any tag and
// length: another than the posted receive's is a mismatch, not a protocol
// error), or the next piece of the message with `tag` and `len` of which
// `done` bytes came (also when that message is being skipped after a
// mismatch). `cma`: this rank offered the peer single-copy reads.
struct SlotExpect {
  bool start = true;
  uint64_t tag = 0, len = 0, done = 0;
  bool cma = false;
};
// "" when `h` may come next, else what is wrong with it (a sentence naming the
// fields). `cap`: payload bytes a slot holds.
std::string checkSlot(const SlotView& h, const SlotExpect& e, size_t cap);

class ShmPair : public Pair {
 public:
  ShmPair(ShmTransport* t, int peer) : t_(t), peer_(peer) {}
  ~ShmPair() override;
  void isend(Request* r) override;
  void irecv(Request* r) override;

  int peer() const { return peer_; }

 private:
  friend class ShmTransport;
  bool progressSends();
  bool progressRecvs();
  bool drainDiscard();
  bool readCma(Request* r);
  SlotView readSlot() const;
  bool readAcks(uint64_t* acks);
  void protocolError(const std::string& what);
  void releaseSlot();
  SlotHdr* outSlot(uint64_t k) const { return reinterpret_cast<SlotHdr*>(out_slots_ + (k % nslots_) * slot_bytes_); }
  SlotHdr* inSlot(uint64_t k) const { return reinterpret_cast<SlotHdr*>(in_slots_ + (k % nslots_) * slot_bytes_); }
  bool slotReady() const { return inSlot(rtail_)->seq.load(std::memory_order_acquire) == rtail_ + 1; }
  bool hasFreeSlot();
  void publish(SlotHdr* h, uint64_t k);
  void failAll(Request::Failure f, const std::string& why);
  void markDead(const std::string& why);
  std::string who() const;

  ShmTransport* t_;
  int peer_;
  int local_ = -1;       // peer's index among this host's ranks
  int sock_ = -1;        // unix socket to the peer (liveness)
  int pid_ = 0;          // peer pid in our pid namespace (SO_PEERCRED)
  bool cma_ = false;     // peer can read our memory with process_vm_readv
  bool cma_in_ = false;  // we can read the peer's (and told it so): it may send single-copy descriptors
  Segment seg_;          // peer's segment (mapped)
  SegHeader* peer_hdr_ = nullptr;
  RingCtl* out_ctl_ = nullptr;  // ring me -> peer (in peer's segment)
  uint8_t* out_slots_ = nullptr;
  RingCtl* in_ctl_ = nullptr;   // ring peer -> me (in my segment)
  uint8_t* in_slots_ = nullptr;
  uint32_t nslots_ = 0, slot_bytes_ = 0;

  uint64_t head_ = 0;         // next slot I write (me -> peer)
  uint64_t tail_cache_ = 0;   // last seen out_ctl_->tail
  uint64_t rtail_ = 0;        // next slot I read (peer -> me)
  uint64_t cma_posted_ = 0;   // CMA descriptors I sent
  uint64_t cma_acked_ = 0;    // CMA messages from the peer I finished
  uint64_t cma_addr_ = 0;     // single-copy read under way: the sender's buffer (read once)
  uint64_t acks_seen_ = 0;    // latest valid in_ctl_->acks
  uint64_t discard_ = 0;      // bytes of a mismatched message still to skip
  uint64_t discard_tag_ = 0, discard_len_ = 0;  // that message
  bool bad_tail_ = false;     // out_ctl_->tail went back or past head_ (hasFreeSlot)
  uint64_t bad_tail_value_ = 0;
  std::deque<Request*> sends_, recvs_, cma_wait_;
  bool dead_ = false;         // connection gone (EOF/error); ring may still hold data
  std::string dead_why_;
  bool failed_ = false;       // pair unusable; every post fails
  std::string failed_why_;
};

class ShmTransport : public Transport {
 public:
  ShmTransport(const CommInfo& info, const std::vector<PeerInfo>& peers);
  ~ShmTransport() override;

  const char* name() const override { return "shm"; }
  std::string localAddress(int peer) override;
  void connect(const std::vector<int>& peers, const std::vector<std::string>& remote) override;
  Pair* pair(int peer) override;
  bool progress() override;
  void wait(int timeout_ms) override;
  void abort(const std::string& why) override;
  std::string abortNotice() override;

  // ---- Capability: the intra-host collective area ----
  // Offered to the algorithms this transport hosts (allreduce_shm.cc in this
  // folder), which reach it from the Transport* their Context hands them with
  // transport::capabilityOf<ShmTransport>(t): non-null exactly for a
  // ShmTransport, whatever its state (check coversCommunicator()). Lives as
  // long as the transport; driving thread only (like everything here but
  // abort()).
  static const Capability kCapability;
  void* capability(const Capability& which) override { return &which == &kCapability ? this : nullptr; }
  // True when every rank of the communicator is connected through this
  // transport (one host) and the collective area exists.
  bool coversCommunicator() const;
  int localIndex(int rank) const { return local_of_[rank]; }
  // Bytes per collective buffer (each rank has two).
  size_t collChunkBytes() const { return geo_.coll_chunk; }
  CollFlags* collFlags(int rank) const;
  uint8_t* collBuf(int rank, int b) const;
  // Monotonic step counter shared (by construction) by all ranks: every rank
  // calls nextCollStep() the same number of times.
  uint64_t nextCollStep() { return ++coll_step_; }
  // Wake `rank` if it sleeps (after publishing a flag it may wait for).
  void wakeRank(int rank);
  // Wake every peer that sleeps.
  void wakeAll();
  // Polls of a flag worth making inline before calling waitFor(): 64 when
  // every local rank has a core of its own, 1 when this host's ranks outnumber
  // the cores this process may use (then the rank we wait for may need ours).
  int inlinePolls() const { return inline_polls_; }
  // Wait until cond() holds: spin briefly (not at all when ranks outnumber
  // cores), yield, then sleep on the doorbell.
  // Checks aborts, peer death and stray messages meanwhile; throws harp::Error
  // (kPeerFailure, kMismatch, or kTimeout with the text timeout_msg() returns)
  // instead of hanging. `what` names the operation in error messages.
  void waitFor(const std::function<bool()>& cond, double timeout_s, const char* what,
               const std::function<std::string()>& timeout_msg);

 private:
  friend class ShmPair;
  bool anythingReady();
  void checkSockets();
  void connectPeers(const std::vector<int>& peers, const std::vector<std::string>& remote);
  void authenticate(const std::vector<int>& peers, const std::vector<std::string>& remote, Deadline dl);
  Hello myHello() const;
  void handleAbort();
  std::string rankName(int r) const;

  CommInfo info_;
  std::vector<PeerInfo> peers_;
  std::vector<int> local_of_;   // rank -> index on this host, -1 elsewhere
  int nlocal_ = 0;
  Geometry geo_;
  Segment seg_;
  std::string seg_how_;
  int listen_fd_ = -1;
  std::string sock_name_;
  uint64_t probe_word_ = 0;     // peers read this with process_vm_readv to test CMA
  size_t cma_threshold_ = 0;
  size_t cma_piece_ = 0;
  std::vector<std::unique_ptr<ShmPair>> pairs_;  // by rank
  std::vector<ShmPair*> active_;                  // connected pairs
  long spin_ns_ = 0;    // waitFor: pause-polling time (HARP_SHM_SPIN_US)
  int inline_polls_ = 64;  // see inlinePolls(); also waitFor's polls between clock reads
  long yield_ns_ = 0;   // wait/waitFor: sched_yield-polling time before sleeping (HARP_SHM_YIELD_US)
  long check_delay_ns_ = 0;  // test hook HARP_SHM_FAULT_CHECK_DELAY_US: waitFor sleeps this long before failIfBroken
  uint64_t coll_step_ = 0;
  uint32_t poll_counter_ = 0;

  std::atomic<bool> aborted_{false};
  bool abort_handled_ = false;
  std::mutex abort_mu_;
  std::string abort_why_;
};

}  // namespace harp::transport::shm
