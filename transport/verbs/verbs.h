// transport/verbs/verbs.h — internals of HARP's RDMA verbs transport.
//
// One VerbsTransport per communicator: a device context, a protection domain,
// one completion queue (with a completion channel for blocking) shared by all
// pairs, a memory registration cache, and one reliable-connected queue pair
// per peer (VerbsPair). The wire protocol is in PROTOCOL.md; in short, every
// irecv sends the peer a "ready to receive" (RTR) control message naming the
// registered destination (addr, rkey, tag, len); the sender matches RTRs to
// its isends in order and moves the bytes with RDMA WRITE WITH IMMEDIATE, whose
// immediate completes the receive on the receiver's side.
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
  char magic[8];          // "HARPIBV1"
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
  uint64_t ka_addr;       // a small region peers may write 0 bytes to (keepalive)
  uint32_t ka_rkey;
  uint32_t reserved;
  char device[32];
};

enum CtrlKind : uint32_t {
  kHello = 0x48490001,     // uncredited; first message on a pair
  kRtr = 0x48490002,       // credited; receiver -> sender: a posted receive
  kMismatch = 0x48490003,  // credited; sender -> receiver: the RTR did not match
  kCredit = 0x48490004,    // uncredited; returns credits
  kAbort = 0x48490005,     // uncredited; communicator aborted (text)
  kBye = 0x48490006,       // uncredited; communicator destroyed
};

constexpr size_t kCtrlSize = 256;
struct Ctrl {
  uint32_t kind;
  uint32_t credits;   // credits returned to the receiver of this message
  uint64_t seq;       // message number on this pair and direction
  uint64_t tag;
  uint64_t len;
  uint64_t addr;
  uint32_t rkey;
  uint32_t rank;
  uint64_t comm_id;
  char text[kCtrlSize - 56];
};
static_assert(sizeof(Ctrl) == kCtrlSize);

// wr_id layout: kind (8 bits) | pair index (24 bits) | slot (32 bits).
enum WrKind : uint64_t { kWrRecv = 1, kWrCtrl = 2, kWrWrite = 3, kWrKeepalive = 4 };
inline uint64_t wrId(WrKind k, uint32_t pair, uint32_t slot) {
  return (static_cast<uint64_t>(k) << 56) | (static_cast<uint64_t>(pair & 0xffffff) << 32) | slot;
}

class VerbsTransport;

// A matched isend being written: chunks go out as plain RDMA WRITEs, the last
// one WITH IMMEDIATE.
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
  uint32_t slot;          // ctrl buffer slot (kWrCtrl)
  SendOp* op;             // kWrWrite
  bool notice;            // an abort/bye/mismatch notice: closing waits for it
  uint32_t ctrl_kind;     // kWrCtrl: which control message
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
  bool pump();                                // post what credits and SQ slots allow
  void onSendCompletion(const ibv_wc& wc);
  void onRecvCompletion(const ibv_wc& wc);
  bool keepaliveDue(Clock::time_point now) const;
  void keepalive(Clock::time_point now);
  bool busy() const { return !sendq_.empty() || !recvq_.empty() || !ops_.empty(); }

  // Failure.
  void closeWithNotice(CtrlKind kind, const std::string& text, const std::string& why,
                       const Ctrl* body = nullptr);
  void fail(const std::string& why);          // QP -> ERR, fail everything pending
  bool closing() const { return closing_; }
  bool failed() const { return failed_; }
  bool finishClosing(Clock::time_point now);  // true when the notice is out or overdue
  void sendBye();

  std::string who() const;
  int peer() const { return peer_; }
  ibv_qp* qp() const { return qp_; }

 private:
  friend class VerbsTransport;
  void bringUp();                             // INIT, receives, RTR, RTS, hello
  bool postCtrl(const Ctrl& c, bool credited, bool notice);
  bool postRecv(uint32_t slot);
  void matchSends();
  bool postWrites(SendOp* op);
  void finishSends();
  void protocolError(const std::string& what);

  VerbsTransport* t_;
  int peer_;
  uint32_t index_;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  Blob remote_{};

  // Registered buffers: receive ring (R + reserve slots) and ctrl send slots.
  std::vector<Ctrl> rx_, tx_;
  ibv_mr* rx_mr_ = nullptr;
  ibv_mr* tx_mr_ = nullptr;
  std::vector<uint32_t> tx_free_;

  // Flow control.
  int credits_ = 0;          // credited messages we may still send to the peer
  int to_return_ = 0;        // credited messages of the peer we consumed, not yet returned
  int sq_used_ = 0;
  std::deque<SqEntry> sq_;   // posted, not completed
  std::deque<Ctrl> ctrl_out_;  // credited ctrl messages waiting for credits/slots

  // Matching state.
  uint64_t send_seq_ = 0;    // next isend's number
  uint64_t recv_seq_ = 0;    // next irecv's number
  std::deque<Request*> sendq_;   // isends not yet matched to an RTR
  std::deque<Ctrl> rtrs_;        // RTRs not yet matched to an isend
  std::deque<std::unique_ptr<SendOp>> ops_;  // matched sends, in order
  std::deque<Request*> recvq_;   // irecvs in posting order (RTR sent or queued)
  std::deque<MrEntry*> recv_mrs_;  // parallel to recvq_

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
