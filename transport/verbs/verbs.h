// transport/verbs/verbs.h — internals of HARP's RDMA verbs transport.
//
// One VerbsTransport per communicator: a device context, a protection domain,
// one completion queue (with a completion channel for blocking) shared by all
// pairs, a memory registration cache, and one reliable-connected queue pair
// per peer (VerbsPair). The wire protocol is in PROTOCOL.md; in short, small
// messages are RDMA-written WITH IMMEDIATE (header + payload) into a per-peer
// eager ring on the receiver; large ones go by rendezvous: the receiver's
// irecv sends "ready to receive" (RTR: addr, rkey, tag, len), the sender checks
// it and RDMA-writes straight into the user buffer, the last write WITH
// IMMEDIATE, whose completion on the receiver completes the irecv.
//
// Threading: one driving thread at a time (progress, wait, isend, irecv hold
// drive_mu_ only in progress/wait); abort() may come from any thread — it
// raises a flag, wakes wait() through an eventfd and does the work itself only
// if no thread is driving.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport/verbs/device.h"
#include "transport/verbs/mr_cache.h"

namespace harp::transport::verbs {

using Clock = std::chrono::steady_clock;

// ---- wire formats ----------------------------------------------------------

// Published through the bootstrap for one peer (localAddress).
struct Blob {
  char magic[8];          // "HARPIBV2"
  uint64_t comm_id;
  uint32_t rank;          // publisher
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint8_t link_layer;
  uint8_t port;
  uint8_t gid[16];
  uint32_t mtu;           // ibv_mtu enum of the publisher's active MTU
  uint32_t credits;       // receive WQEs the publisher grants for credited messages
  uint64_t ka_addr;       // a small region peers may write to (keepalive)
  uint32_t ka_rkey;
  uint32_t eager_rkey;    // the publisher's eager ring for this peer
  uint64_t eager_addr;
  uint32_t eager_slots;
  uint32_t eager_slot_bytes;  // header + payload
  char device[32];
};

enum CtrlKind : uint32_t {
  kHello = 0x48490001,     // uncredited; first message on a pair
  kRtr = 0x48490002,       // credited; receiver -> sender: receive #seq is posted at addr/rkey
  kMismatch = 0x48490003,  // uncredited notice; tag/len of the side that found a mismatch
  kCredit = 0x48490004,    // uncredited; returns credits
  kAbort = 0x48490005,     // uncredited notice; communicator aborted (text)
  kBye = 0x48490006,       // uncredited notice; communicator destroyed
  kRts = 0x48490007,       // credited; sender -> receiver: message #seq (tag, len) is rendezvous
};

constexpr size_t kCtrlSize = 256;
struct Ctrl {
  uint32_t kind;
  uint32_t credits;        // receive-WQE credits returned to the receiver of this message
  uint64_t seq;            // message number on this pair and direction
  uint64_t tag;
  uint64_t len;
  uint64_t addr;           // kRtr: destination; kMismatch: 1 if sent by the receiving side
  uint32_t rkey;
  uint32_t rank;
  uint64_t comm_id;
  uint32_t eager_credits;  // eager-ring slots returned
  uint32_t pad;
  char text[kCtrlSize - 64];
};
static_assert(sizeof(Ctrl) == kCtrlSize);

// Eager slot layout: header, then up to eager_slot_bytes - sizeof(EagerHdr) bytes.
struct EagerHdr {
  uint64_t seq;
  uint64_t tag;
  uint64_t len;
  uint64_t pad;
};

// Immediate data: eager writes carry kImmEager | ring slot; rendezvous writes
// carry the message number's low 31 bits.
constexpr uint32_t kImmEager = 0x80000000u;

// wr_id layout: kind (8 bits) | pair index (24 bits) | generation (8) | slot (24).
enum WrKind : uint64_t { kWrRecv = 1, kWrCtrl = 2, kWrWrite = 3, kWrKeepalive = 4, kWrEager = 5 };
inline uint64_t wrId(WrKind k, uint32_t pair, uint32_t slot) {
  return (static_cast<uint64_t>(k) << 56) | (static_cast<uint64_t>(pair & 0xffffff) << 32) | slot;
}

class VerbsTransport;

// A rendezvous send whose RTR arrived: chunks go out as plain RDMA WRITEs,
// the last one WITH IMMEDIATE.
struct SendOp {
  Request* req;
  MrEntry* mr;
  uint64_t seq;
  uint64_t raddr;
  uint32_t rkey;
  size_t offset;          // bytes posted so far
  int outstanding = 0;    // WRs posted, not yet completed
  bool all_posted = false;
};

// What one send-queue entry was, in posting order (completions arrive in that order).
struct SqEntry {
  WrKind kind;
  uint32_t slot;          // ctrl buffer slot (kWrCtrl), staging slot (kWrEager)
  SendOp* op;             // kWrWrite
  bool notice;            // an abort/bye/mismatch notice: closing waits for it
  uint32_t ctrl_kind;     // kWrCtrl: which control message
};

struct RecvEntry {
  Request* req;
  MrEntry* mr;            // registered destination (rendezvous receives)
  bool rtr_sent;
};

class VerbsPair : public Pair {
 public:
  VerbsPair(VerbsTransport* t, int peer, uint32_t index);
  ~VerbsPair() override;
  void isend(Request* r) override;
  void irecv(Request* r) override;

  // Setup.
  void create();                              // QP + buffers (before localAddress)
  Blob localBlob() const;
  void connectTo(const Blob& remote);         // INIT -> RTR -> RTS, post receives, hello
  void resetForRetry();                       // after a failed hello: back to RTR/RTS
  bool helloDone() const { return hello_recv_ && hello_sent_; }
  bool helloFailed() const { return hello_failed_; }

  // Driving.
  bool pump();                                // post what credits and slots allow
  void onSendCompletion(const ibv_wc& wc);
  void onRecvCompletion(const ibv_wc& wc);
  bool keepaliveDue(Clock::time_point now) const;
  void keepalive(Clock::time_point now);
  bool busy() const {
    return !sendq_.empty() || !waiting_rtr_.empty() || !ops_.empty() || !recvs_.empty() || eager_inflight_ > 0;
  }

  // Failure.
  void closeWithNotice(CtrlKind kind, const std::string& text, const std::string& why,
                       const Ctrl* body = nullptr);
  // QP -> ERR, fail everything pending (keep_arrived: eager messages already in
  // the ring stay deliverable — the peer closed after sending them).
  void fail(const std::string& why, bool keep_arrived = false);
  bool closing() const { return closing_; }
  bool failed() const { return failed_; }
  bool finishClosing(Clock::time_point now);  // true when the notice is out or overdue
  void sendBye();

  std::string who() const;
  int peer() const { return peer_; }

 private:
  friend class VerbsTransport;
  void bringUp();
  bool postCtrl(const Ctrl& c, bool credited, bool notice);
  bool postRecv(uint32_t slot);
  bool announce(Request* r);                  // eager write or RTS for the oldest unsent message
  bool postEager(Request* r);
  void onRtr(const Ctrl& c);
  void startRendezvous(Request* r, const Ctrl& rtr);
  bool postWrites(SendOp* op);
  void finishSends();
  void onEagerData(uint32_t slot);
  void deliverEager(uint64_t seq, uint32_t slot, RecvEntry& e);
  void onRts(const Ctrl& c);
  bool checkHeader(uint64_t seq, uint64_t tag, uint64_t len, RecvEntry& e);
  void sendRtr(uint64_t seq, RecvEntry& e);
  void onMismatchNotice(const Ctrl& c);
  void onBye();
  void failQueued(const std::string& why, bool keep_arrived);
  void protocolError(const std::string& what);

  VerbsTransport* t_;
  int peer_;
  uint32_t index_;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  Blob remote_{};

  // Registered buffers: control receive ring and send slots; eager rings.
  std::vector<Ctrl> rx_, tx_;
  ibv_mr* rx_mr_ = nullptr;
  ibv_mr* tx_mr_ = nullptr;
  std::vector<uint32_t> tx_free_;
  std::vector<char> eager_rx_, eager_tx_;     // this side's ring (peer writes) / staging
  ibv_mr* eager_rx_mr_ = nullptr;
  ibv_mr* eager_tx_mr_ = nullptr;
  std::vector<Request*> eager_req_;           // by staging slot: the send it carries
  uint32_t eager_tx_next_ = 0;                // staging slot (= remote slot) of the next eager send
  int eager_credits_ = 0;                     // free slots in the peer's ring
  int eager_to_return_ = 0;                   // slots of ours consumed, not yet returned
  int eager_inflight_ = 0;
  uint32_t eager_rx_next_ = 0;                // next slot the peer will write (for checking)

  // Flow control.
  int credits_ = 0;          // credited messages we may still send to the peer
  int to_return_ = 0;        // credited messages of the peer we consumed, not yet returned
  int sq_used_ = 0;
  std::deque<SqEntry> sq_;   // posted, not completed
  std::deque<Ctrl> ctrl_out_;  // credited ctrl messages waiting for credits/slots

  // Sending side.
  uint64_t send_seq_ = 0;                     // next isend's number
  std::deque<Request*> sendq_;                // not yet announced
  std::map<uint64_t, Request*> waiting_rtr_;  // rendezvous sends announced, no RTR yet
  std::map<uint64_t, Ctrl> early_rtrs_;       // RTRs for sends not yet announced
  std::deque<std::unique_ptr<SendOp>> ops_;   // rendezvous writes, in posting order

  // Receiving side.
  uint64_t recv_seq_ = 0;                     // next irecv's number
  std::map<uint64_t, RecvEntry> recvs_;       // posted, not complete
  std::deque<std::pair<uint64_t, uint32_t>> unexpected_eager_;  // (seq, slot) before the irecv
  std::map<uint64_t, Ctrl> early_rts_;        // RTS before the irecv

  uint32_t gen_ = 0;         // bumped by resetForRetry; stale completions are ignored
  bool hello_sent_ = false, hello_recv_ = false, hello_failed_ = false;
  bool notice_done_ = false;
  bool closing_ = false, failed_ = false, peer_closed_ = false;
  std::string fail_reason_, closing_reason_;
  Clock::time_point closing_deadline_{};
  Clock::time_point last_heard_{};
  Clock::time_point last_ka_{};
  bool ka_outstanding_ = false;
};

class VerbsTransport : public Transport {
 public:
  VerbsTransport(const CommInfo& info, const std::vector<PeerInfo>& peers);
  ~VerbsTransport() override;
  const char* name() const override { return "verbs"; }
  std::string localAddress(int peer) override;
  void connect(const std::vector<int>& peers, const std::vector<std::string>& remote) override;
  Pair* pair(int peer) override;
  bool progress() override;
  void wait(int timeout_ms) override;
  void abort(const std::string& why) override;
  void registerMemory(void* p, size_t n) override;
  void deregisterMemory(void* p) override;

  std::string rankName(int r) const;

  // Shared with pairs.
  CommInfo info_;
  std::vector<PeerInfo> peer_info_;
  DeviceChoice dev_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_comp_channel* chan_ = nullptr;
  std::unique_ptr<MrCache> mrs_;
  ibv_mr* ka_mr_ = nullptr;
  uint64_t ka_buf_[8] = {0};

  // Tunables (environment, read once).
  int rq_credits_;      // HARP_IB_RQ_DEPTH: credited receive WQEs per pair
  int rq_reserve_;      // extra WQEs for uncredited notices
  int sq_depth_;        // HARP_IB_SQ_DEPTH: send WRs in flight per pair
  size_t max_chunk_;    // largest single RDMA WRITE
  int ka_ms_;           // HARP_IB_KEEPALIVE_MS
  size_t eager_max_;    // HARP_IB_EAGER: largest message sent eagerly
  int eager_slots_;     // HARP_IB_EAGER_SLOTS: eager ring slots per peer
  uint8_t qp_timeout_;  // HARP_IB_TIMEOUT (4.096 us * 2^x per retry)
  uint8_t retry_cnt_;   // HARP_IB_RETRY_CNT

 private:
  friend class VerbsPair;
  bool pollCq();          // drain the CQ; true if anything completed
  bool drive();           // pollCq + pump every pair
  void doAbort();
  void connectOnce(const std::vector<int>& peers, Clock::time_point deadline);

  std::map<int, std::unique_ptr<VerbsPair>> pairs_;
  std::vector<VerbsPair*> by_index_;
  int wake_fd_ = -1;
  unsigned unacked_events_ = 0;
  bool armed_ = false;
  std::mutex drive_mu_;
  std::mutex abort_mu_;
  std::atomic<bool> abort_requested_{false};
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace harp::transport::verbs
