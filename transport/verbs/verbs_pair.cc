// transport/verbs/verbs_pair.cc — one reliable-connected queue pair to one peer:
// setup (QP states, hello), posting primitives, credits, completion dispatch,
// keepalive, failure. The message protocol (eager / rendezvous) is in
// verbs_protocol.cc; the wire format in PROTOCOL.md.
//
// Called only by the transport's driving thread (VerbsTransport holds drive_mu_
// around every entry).
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/log.h"
#include "base/types.h"
#include "transport/verbs/verbs.h"

namespace harp::transport::verbs {

namespace {
constexpr uint32_t kSlotMask = 0xffffff;
uint32_t slotOf(uint64_t wr_id) { return static_cast<uint32_t>(wr_id) & kSlotMask; }
uint32_t genOf(uint64_t wr_id) { return static_cast<uint32_t>(wr_id) >> 24; }

std::string errnoText(const char* what, int err) { return std::string(what) + ": " + std::strerror(err); }
}  // namespace

VerbsPair::VerbsPair(VerbsTransport* t, int peer, uint32_t index) : t_(t), peer_(peer), index_(index) {}

VerbsPair::~VerbsPair() {
  if (qp_) ibv_destroy_qp(qp_);
  if (rx_mr_) ibv_dereg_mr(rx_mr_);
  if (tx_mr_) ibv_dereg_mr(tx_mr_);
  if (eager_rx_mr_) ibv_dereg_mr(eager_rx_mr_);
  if (eager_tx_mr_) ibv_dereg_mr(eager_tx_mr_);
  for (auto& op : ops_)
    if (op->mr) t_->mrs_->release(op->mr);
  for (auto& [seq, e] : recvs_)
    if (e.mr) t_->mrs_->invalidate(e.mr);
}

std::string VerbsPair::who() const { return t_->rankName(peer_); }

// ---------------------------------------------------------------------------
// Setup

void VerbsPair::create() {
  int R = t_->rq_credits_ + t_->rq_reserve_, S = t_->sq_depth_ + t_->rq_reserve_;
  ibv_qp_init_attr a{};
  a.send_cq = t_->cq_;
  a.recv_cq = t_->cq_;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = S;
  a.cap.max_recv_wr = R;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.sq_sig_all = 0;
  qp_ = ibv_create_qp(t_->pd_, &a);
  if (!qp_) throw ErrnoError("verbs: ibv_create_qp for " + who() + " on " + t_->dev_.name, errno);
  rx_.assign(R, Ctrl{});
  tx_.assign(S, Ctrl{});
  rx_mr_ = ibv_reg_mr(t_->pd_, rx_.data(), rx_.size() * sizeof(Ctrl), IBV_ACCESS_LOCAL_WRITE);
  tx_mr_ = ibv_reg_mr(t_->pd_, tx_.data(), tx_.size() * sizeof(Ctrl), IBV_ACCESS_LOCAL_WRITE);
  if (!rx_mr_ || !tx_mr_) throw ErrnoError("verbs: registering control buffers for " + who(), errno);
  size_t slot_bytes = sizeof(EagerHdr) + t_->eager_max_;
  eager_rx_.assign(slot_bytes * t_->eager_slots_, 0);
  eager_tx_.assign(slot_bytes * t_->eager_slots_, 0);
  eager_req_.assign(t_->eager_slots_, nullptr);
  eager_rx_mr_ = ibv_reg_mr(t_->pd_, eager_rx_.data(), eager_rx_.size(),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  eager_tx_mr_ = ibv_reg_mr(t_->pd_, eager_tx_.data(), eager_tx_.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!eager_rx_mr_ || !eager_tx_mr_) throw ErrnoError("verbs: registering eager buffers for " + who(), errno);
  std::random_device rd;
  psn_ = rd() & 0xffffff;
}

Blob VerbsPair::localBlob() const {
  Blob b{};
  std::memcpy(b.magic, "HARPIBV2", 8);
  b.comm_id = t_->info_.comm_id;
  b.rank = static_cast<uint32_t>(t_->info_.rank);
  b.qpn = qp_->qp_num;
  b.psn = psn_;
  b.lid = t_->dev_.lid;
  b.link_layer = t_->dev_.link_layer;
  b.port = static_cast<uint8_t>(t_->dev_.port);
  std::memcpy(b.gid, t_->dev_.gid.raw, 16);
  b.mtu = t_->dev_.active_mtu;
  b.credits = static_cast<uint32_t>(t_->rq_credits_);
  b.ka_addr = reinterpret_cast<uintptr_t>(t_->ka_buf_);
  b.ka_rkey = t_->ka_mr_->rkey;
  b.eager_addr = reinterpret_cast<uintptr_t>(eager_rx_.data());
  b.eager_rkey = eager_rx_mr_->rkey;
  b.eager_slots = static_cast<uint32_t>(t_->eager_slots_);
  b.eager_slot_bytes = static_cast<uint32_t>(sizeof(EagerHdr) + t_->eager_max_);
  std::snprintf(b.device, sizeof b.device, "%s", t_->dev_.name.c_str());
  return b;
}

static void modify(ibv_qp* qp, ibv_qp_attr& a, int mask, const char* step, const std::string& who) {
  int rc = ibv_modify_qp(qp, &a, mask);
  if (rc) throw ErrnoError(std::string("verbs: queue pair to ") + who + ": ibv_modify_qp(" + step + ")", rc);
}

static void toInit(ibv_qp* qp, int port, const std::string& who) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(port);
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  modify(qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT", who);
}

void VerbsPair::connectTo(const Blob& remote) {
  if (std::memcmp(remote.magic, "HARPIBV2", 8) != 0)
    throw Error(Error::kInternal, "verbs: " + who() + " published a malformed address (bad magic)");
  if (remote.comm_id != t_->info_.comm_id || static_cast<int>(remote.rank) != peer_)
    throw Error(Error::kInternal, "verbs: address from " + who() + " belongs to another communicator or rank");
  if (remote.link_layer != t_->dev_.link_layer)
    throw Error(Error::kUnavailable, "verbs: " + who() + "'s RDMA device " + std::string(remote.device) +
                                         " has link layer " + linkLayerName(remote.link_layer) + " but this rank's " +
                                         t_->dev_.name + " has " + linkLayerName(t_->dev_.link_layer) +
                                         "; they cannot connect (use HARP_IB_HCA to pick matching devices)");
  if (remote.eager_slots != static_cast<uint32_t>(t_->eager_slots_) ||
      remote.eager_slot_bytes != sizeof(EagerHdr) + t_->eager_max_)
    throw Error(Error::kInvalidArgument, "verbs: " + who() + " uses HARP_IB_EAGER/HARP_IB_EAGER_SLOTS " +
                                             std::to_string(remote.eager_slot_bytes - sizeof(EagerHdr)) + "/" +
                                             std::to_string(remote.eager_slots) + ", this rank " +
                                             std::to_string(t_->eager_max_) + "/" + std::to_string(t_->eager_slots_) +
                                             "; set them alike on every rank");
  remote_ = remote;
  credits_ = static_cast<int>(remote.credits);
  eager_credits_ = static_cast<int>(remote.eager_slots);
  gen_ = 0;
  bringUp();
}

void VerbsPair::bringUp() {
  toInit(qp_, t_->dev_.port, who());
  for (uint32_t s = 0; s < rx_.size(); ++s)
    if (!postRecv(s)) throw ErrnoError("verbs: posting receives for " + who(), errno);
  tx_free_.clear();
  for (uint32_t s = 0; s < tx_.size(); ++s) tx_free_.push_back(static_cast<uint32_t>(tx_.size()) - 1 - s);
  sq_.clear();
  sq_used_ = 0;

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = std::min(t_->dev_.active_mtu, static_cast<ibv_mtu>(remote_.mtu));
  a.dest_qp_num = remote_.qpn;
  a.rq_psn = (remote_.psn + (hello_recv_ ? 1 : 0)) & 0xffffff;  // a reset keeps what arrived
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;  // 0.64 ms
  a.ah_attr.port_num = static_cast<uint8_t>(t_->dev_.port);
  a.ah_attr.dlid = remote_.lid;
  if (t_->dev_.link_layer == IBV_LINK_LAYER_ETHERNET || t_->dev_.lid == 0 || remote_.lid == 0) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote_.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(t_->dev_.gid_index);
    a.ah_attr.grh.hop_limit = 64;
  }
  modify(qp_, a,
         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
             IBV_QP_MIN_RNR_TIMER,
         "RTR", who());
  ibv_qp_attr b{};
  b.qp_state = IBV_QPS_RTS;
  b.timeout = t_->qp_timeout_;
  b.retry_cnt = t_->retry_cnt_;
  b.rnr_retry = 7;  // receiver not ready: retry forever (credits make it rare)
  b.sq_psn = psn_;
  b.max_rd_atomic = 1;
  modify(qp_, b,
         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
         "RTS", who());
  hello_sent_ = false;
  hello_failed_ = false;
  Ctrl h{};
  h.kind = kHello;
  h.rank = static_cast<uint32_t>(t_->info_.rank);
  h.comm_id = t_->info_.comm_id;
  if (!postCtrl(h, /*credited=*/false, /*notice=*/false)) throw ErrnoError("verbs: sending hello to " + who(), errno);
  last_heard_ = Clock::now();
}

// The peer's queue pair was not ready when our hello went out (it reached
// RTR later than our retries lasted): start this side over, same PSNs.
void VerbsPair::resetForRetry() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  modify(qp_, a, IBV_QP_STATE, "RESET", who());
  ++gen_;
  bringUp();
}

// ---------------------------------------------------------------------------
// Posting

bool VerbsPair::postRecv(uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(&rx_[slot]), sizeof(Ctrl), rx_mr_->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = wrId(kWrRecv, index_, ((gen_ & 0xff) << 24) | slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(qp_, &wr, &bad) == 0;
}

bool VerbsPair::postCtrl(const Ctrl& c, bool credited, bool notice) {
  int limit = t_->sq_depth_ + (credited ? 0 : t_->rq_reserve_);
  if (sq_used_ >= limit || tx_free_.empty()) return false;
  if (credited && credits_ <= 0) return false;
  uint32_t slot = tx_free_.back();
  tx_[slot] = c;
  if (credited || c.kind == kCredit) {
    tx_[slot].credits = static_cast<uint32_t>(to_return_);
    tx_[slot].eager_credits = static_cast<uint32_t>(eager_to_return_);
    to_return_ = 0;
    eager_to_return_ = 0;
  }
  ibv_sge sge{reinterpret_cast<uintptr_t>(&tx_[slot]), sizeof(Ctrl), tx_mr_->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wrId(kWrCtrl, index_, ((gen_ & 0xff) << 24) | slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  int rc = ibv_post_send(qp_, &wr, &bad);
  if (rc) {
    if (credited || c.kind == kCredit) {
      to_return_ += static_cast<int>(tx_[slot].credits);
      eager_to_return_ += static_cast<int>(tx_[slot].eager_credits);
    }
    errno = rc;
    return false;
  }
  tx_free_.pop_back();
  if (credited) --credits_;
  ++sq_used_;
  sq_.push_back({kWrCtrl, slot, nullptr, notice, c.kind});
  return true;
}

bool VerbsPair::postWrites(SendOp* op) {
  Request* r = op->req;
  while (!op->all_posted) {
    if (sq_used_ >= t_->sq_depth_) return false;
    size_t chunk = std::min(t_->max_chunk_, r->len - op->offset);
    bool last = op->offset + chunk == r->len;
    if (last && credits_ <= 0) return false;
    ibv_sge sge{};
    ibv_send_wr wr{}, *bad = nullptr;
    if (chunk) {
      sge.addr = reinterpret_cast<uintptr_t>(r->buf) + op->offset;
      sge.length = static_cast<uint32_t>(chunk);
      sge.lkey = op->mr->mr->lkey;
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    wr.wr_id = wrId(kWrWrite, index_, (gen_ & 0xff) << 24);
    wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (last) wr.imm_data = htonl(static_cast<uint32_t>(op->seq));
    wr.wr.rdma.remote_addr = op->raddr + op->offset;
    wr.wr.rdma.rkey = op->rkey;
    int rc = ibv_post_send(qp_, &wr, &bad);
    if (rc) {
      closeWithNotice(kAbort, "rank " + std::to_string(t_->info_.rank) + " could not post an RDMA write",
                      errnoText(("verbs: ibv_post_send (RDMA write to " + who() + ")").c_str(), rc));
      return false;
    }
    ++sq_used_;
    ++op->outstanding;
    sq_.push_back({kWrWrite, 0, op, false, 0});
    op->offset += chunk;
    if (last) {
      --credits_;
      op->all_posted = true;
    }
  }
  return true;
}

// Copy a small message into the staging slot and write header + payload into
// the same slot of the peer's eager ring, WITH IMMEDIATE (slot | kImmEager).
bool VerbsPair::postEager(Request* r) {
  if (eager_credits_ <= 0 || credits_ <= 0 || sq_used_ >= t_->sq_depth_) return false;
  uint32_t slot = eager_tx_next_;
  if (eager_req_[slot]) return false;  // the previous write from this slot has not completed
  size_t slot_bytes = sizeof(EagerHdr) + t_->eager_max_;
  char* p = eager_tx_.data() + slot * slot_bytes;
  EagerHdr h{r->tp_word, r->tag, r->len, 0};
  std::memcpy(p, &h, sizeof h);
  if (r->len) std::memcpy(p + sizeof h, r->buf, r->len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(p), static_cast<uint32_t>(sizeof h + r->len), eager_tx_mr_->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wrId(kWrEager, index_, ((gen_ & 0xff) << 24) | slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(kImmEager | slot);
  wr.wr.rdma.remote_addr = remote_.eager_addr + slot * slot_bytes;
  wr.wr.rdma.rkey = remote_.eager_rkey;
  int rc = ibv_post_send(qp_, &wr, &bad);
  if (rc) {
    closeWithNotice(kAbort, "rank " + std::to_string(t_->info_.rank) + " could not post an RDMA write",
                    errnoText(("verbs: ibv_post_send (eager write to " + who() + ")").c_str(), rc));
    return false;
  }
  eager_req_[slot] = r;
  eager_tx_next_ = (slot + 1) % static_cast<uint32_t>(t_->eager_slots_);
  --eager_credits_;
  --credits_;
  ++eager_inflight_;
  ++sq_used_;
  sq_.push_back({kWrEager, slot, nullptr, false, 0});
  return true;
}

bool VerbsPair::pump() {
  if (failed_ || closing_ || peer_closed_) return false;
  bool moved = false;
  while (!ctrl_out_.empty() && postCtrl(ctrl_out_.front(), /*credited=*/true, false)) {
    ctrl_out_.pop_front();
    moved = true;
  }
  // New sends, strictly in order: eager write, or RTS (then wait for the RTR).
  while (!sendq_.empty() && !failed_ && !closing_ && announce(sendq_.front())) {
    sendq_.pop_front();
    moved = true;
  }
  if (failed_ || closing_) return true;
  for (auto& op : ops_) {
    if (op->all_posted) continue;
    size_t before = op->offset;
    bool done = postWrites(op.get());
    moved |= op->offset != before || done;
    if (!done) break;
  }
  if (failed_ || closing_) return true;
  if (to_return_ >= std::max(1, t_->rq_credits_ / 4) || eager_to_return_ >= std::max(1, t_->eager_slots_ / 2)) {
    Ctrl c{};
    c.kind = kCredit;
    moved |= postCtrl(c, /*credited=*/false, false);
  }
  return moved;
}

void VerbsPair::finishSends() {
  while (!ops_.empty() && ops_.front()->all_posted && ops_.front()->outstanding == 0) {
    SendOp* op = ops_.front().get();
    if (op->mr) t_->mrs_->release(op->mr);
    op->mr = nullptr;
    if (op->req) op->req->complete();
    ops_.pop_front();
  }
}

void VerbsPair::onSendCompletion(const ibv_wc& wc) {
  if (genOf(wc.wr_id) != (gen_ & 0xff) || sq_.empty()) return;  // from before a reset
  SqEntry e = sq_.front();
  sq_.pop_front();
  --sq_used_;
  Request* eager_done = nullptr;
  if (e.kind == kWrCtrl) tx_free_.push_back(e.slot);
  if (e.kind == kWrWrite && e.op) --e.op->outstanding;
  if (e.kind == kWrEager) {
    eager_done = eager_req_[e.slot];
    eager_req_[e.slot] = nullptr;
    --eager_inflight_;
  }
  if (e.kind == kWrKeepalive) {
    ka_outstanding_ = false;
    HARP_TRACE("verbs: keepalive to %s: %s", who().c_str(), ibv_wc_status_str(wc.status));
  }
  if (wc.status != IBV_WC_SUCCESS) {
    if (failed_) return;
    if (!hello_sent_ && e.ctrl_kind == kHello) {
      hello_failed_ = true;  // connect() resets and tries again until its deadline
      return;
    }
    if (closing_) {
      notice_done_ = true;
      return;
    }
    if (eager_done && !eager_done->done()) eager_done->fail(Request::kPeerFailure, "eager write failed");
    std::string st = ibv_wc_status_str(wc.status);
    if (wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_RNR_RETRY_EXC_ERR)
      fail(who() + " is unreachable over RDMA (" + st + "): the process died or closed its communicator");
    else
      fail("verbs: send to " + who() + " failed: " + st + " (vendor error " + std::to_string(wc.vendor_err) + ")");
    return;
  }
  last_heard_ = Clock::now();
  if (e.kind == kWrCtrl && e.ctrl_kind == kHello) hello_sent_ = true;
  if (e.notice) notice_done_ = true;
  if (e.kind == kWrWrite) finishSends();
  if (eager_done) eager_done->complete();
}

void VerbsPair::onRecvCompletion(const ibv_wc& wc) {
  if (genOf(wc.wr_id) != (gen_ & 0xff)) return;
  uint32_t slot = slotOf(wc.wr_id);
  if (wc.status != IBV_WC_SUCCESS) {
    if (failed_ || closing_ || wc.status == IBV_WC_WR_FLUSH_ERR) return;
    fail("verbs: receive from " + who() + " failed: " + ibv_wc_status_str(wc.status));
    return;
  }
  last_heard_ = Clock::now();
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    if (!postRecv(slot)) return fail(errnoText(("verbs: re-posting a receive for " + who()).c_str(), errno));
    ++to_return_;
    uint32_t imm = ntohl(wc.imm_data);
    if (imm & kImmEager) return onEagerData(imm & ~kImmEager);
    // Rendezvous data for the receive whose number ends in these 31 bits.
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
      if ((it->first & 0x7fffffffu) == imm && it->second.rtr_sent) {
        RecvEntry e = it->second;
        recvs_.erase(it);
        if (e.mr) t_->mrs_->release(e.mr);
        e.req->complete();
        return;
      }
    }
    return protocolError("data for message #" + std::to_string(imm) + " arrived with no matching receive");
  }
  if (wc.opcode != IBV_WC_RECV) return protocolError("unexpected completion opcode " + std::to_string(wc.opcode));
  Ctrl c = rx_[slot];
  if (!postRecv(slot)) return fail(errnoText(("verbs: re-posting a receive for " + who()).c_str(), errno));
  if (c.credits) credits_ += static_cast<int>(c.credits);
  if (c.eager_credits) eager_credits_ += static_cast<int>(c.eager_credits);
  switch (c.kind) {
    case kHello:
      if (c.comm_id != t_->info_.comm_id || static_cast<int>(c.rank) != peer_)
        return fail("verbs: hello on the queue pair to " + who() + " came from another communicator or rank");
      hello_recv_ = true;
      return;
    case kRtr:
      ++to_return_;
      return onRtr(c);
    case kRts:
      ++to_return_;
      return onRts(c);
    case kCredit:
      return;
    case kMismatch:
      return onMismatchNotice(c);
    case kAbort:
      c.text[sizeof c.text - 1] = 0;
      return fail(who() + " aborted the communicator: " + std::string(c.text));
    case kBye:
      return onBye();
    default:
      return protocolError("unknown control message kind " + std::to_string(c.kind));
  }
}

// ---------------------------------------------------------------------------
// Liveness and failure

// The peer destroyed its communicator. Everything it sent came before the
// goodbye (RC order): eager messages already in our ring stay deliverable, and
// our writes already posted complete normally (their acknowledgements may be
// processed after the goodbye). What can never complete fails now: receives
// without data, and sends not yet on the wire.
void VerbsPair::onBye() {
  peer_closed_ = true;
  fail_reason_ = who() + " has closed its communicator";
  failQueued(fail_reason_, true);
}

// Fail the requests that are still only queued here (sends not on the wire or
// waiting for the peer's RTR, posted receives) and drop the protocol queues;
// keep_arrived keeps eager messages already in our ring deliverable.
void VerbsPair::failQueued(const std::string& why, bool keep_arrived) {
  auto failReq = [&](Request* r) {
    if (r && !r->done()) r->fail(Request::kPeerFailure, why);
  };
  for (Request* r : sendq_) failReq(r);
  for (auto& [seq, r] : waiting_rtr_) failReq(r);
  for (auto& [seq, e] : recvs_) {
    failReq(e.req);
    if (e.mr) t_->mrs_->invalidate(e.mr);
  }
  sendq_.clear();
  waiting_rtr_.clear();
  early_rtrs_.clear();
  recvs_.clear();
  if (!keep_arrived) unexpected_eager_.clear();
  early_rts_.clear();
  ctrl_out_.clear();
}

bool VerbsPair::keepaliveDue(Clock::time_point now) const {
  if (failed_ || closing_ || ka_outstanding_ || !busy()) return false;
  auto last = std::max(last_heard_, last_ka_);
  return now - last >= std::chrono::milliseconds(t_->ka_ms_);
}

// A zero-byte RDMA write the peer's NIC must acknowledge: if the peer's queue
// pair is gone, retries run out and the completion reports it.
void VerbsPair::keepalive(Clock::time_point now) {
  if (sq_used_ >= t_->sq_depth_ + t_->rq_reserve_) return;
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wrId(kWrKeepalive, index_, (gen_ & 0xff) << 24);
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  // 8 bytes rather than 0: rxe never times out a zero-length write to a dead QP.
  ibv_sge sge{reinterpret_cast<uintptr_t>(&t_->ka_buf_[1]), 8, t_->ka_mr_->lkey};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = remote_.ka_addr;
  wr.wr.rdma.rkey = remote_.ka_rkey;
  if (ibv_post_send(qp_, &wr, &bad)) return;
  ++sq_used_;
  sq_.push_back({kWrKeepalive, 0, nullptr, false, 0});
  HARP_TRACE("verbs: keepalive to %s", who().c_str());
  ka_outstanding_ = true;
  last_ka_ = now;
}

void VerbsPair::closeWithNotice(CtrlKind kind, const std::string& text, const std::string& why, const Ctrl* body) {
  if (failed_ || closing_) return;
  Ctrl c{};
  if (body) c = *body;
  c.kind = kind;
  c.rank = static_cast<uint32_t>(t_->info_.rank);
  c.comm_id = t_->info_.comm_id;
  std::snprintf(c.text, sizeof c.text, "%s", text.c_str());
  notice_done_ = false;
  if (!postCtrl(c, /*credited=*/false, /*notice=*/true)) return fail(why);
  closing_ = true;
  closing_reason_ = why;
  closing_deadline_ = Clock::now() + std::chrono::milliseconds(200);
}

bool VerbsPair::finishClosing(Clock::time_point now) {
  if (!closing_) return false;
  if (!notice_done_ && now < closing_deadline_) return false;
  closing_ = false;
  fail(closing_reason_);
  return true;
}

void VerbsPair::sendBye() {
  if (failed_ || closing_ || !qp_) return;
  Ctrl c{};
  c.kind = kBye;
  c.rank = static_cast<uint32_t>(t_->info_.rank);
  c.comm_id = t_->info_.comm_id;
  notice_done_ = false;
  if (postCtrl(c, false, true)) {
    closing_ = true;
    closing_reason_ = "communicator destroyed";
    closing_deadline_ = Clock::now() + std::chrono::milliseconds(200);
  }
}

void VerbsPair::fail(const std::string& why, bool keep_arrived) {
  if (failed_) return;
  failed_ = true;
  closing_ = false;
  fail_reason_ = why;
  // Error state first: after this the NIC accepts no more writes into buffers
  // whose receives we are about to fail (the caller may free them).
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp_, &a, IBV_QP_STATE);
  // Posted work requests first (their buffers are released), then the queues.
  auto failReq = [&](Request* r) {
    if (r && !r->done()) r->fail(Request::kPeerFailure, why);
  };
  for (auto& op : ops_) {
    failReq(op->req);
    op->req = nullptr;
    if (op->mr) t_->mrs_->release(op->mr);
    op->mr = nullptr;
  }
  for (Request*& r : eager_req_) {
    failReq(r);
    r = nullptr;
  }
  failQueued(why, keep_arrived);
  HARP_INFO("verbs: pair to %s failed: %s", who().c_str(), why.c_str());
}

void VerbsPair::protocolError(const std::string& what) {
  closeWithNotice(kAbort, "protocol error on rank " + std::to_string(t_->info_.rank) + ": " + what,
                  "verbs: protocol error on the queue pair to " + who() + ": " + what);
}

}  // namespace harp::transport::verbs
