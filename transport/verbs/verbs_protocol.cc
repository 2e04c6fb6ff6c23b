// transport/verbs/verbs_protocol.cc — the message protocol of one verbs pair.
//
// Messages are numbered per pair and direction (seq); the k-th isend matches
// the k-th irecv. Two ways to move a message (PROTOCOL.md has the details):
//   * eager (len <= HARP_IB_EAGER): the sender copies header + payload into a
//     staging slot and RDMA-writes it WITH IMMEDIATE into the same slot of the
//     receiver's eager ring; the receiver checks tag/len and copies out. A send
//     completes without the receiver's help (no deadlock when both sides send
//     first), bounded by the ring's slots (credits).
//   * rendezvous (larger): the sender announces (RTS: seq, tag, len); the
//     receiver, as soon as its irecv is posted, registers the buffer and sends
//     RTR (seq, tag, len, addr, rkey); the sender checks tag/len and RDMA-writes
//     straight into the user buffer, the last write WITH IMMEDIATE (seq).
// Whoever sees a tag/length disagreement first fails its side (the receiver
// with kMismatch and what the sender sent) and tells the other with a notice.
//
// Called only by the transport's driving thread, under drive_mu_.
#include <cstring>

#include "base/log.h"
#include "base/types.h"
#include "transport/verbs/verbs.h"

namespace harp::transport::verbs {

void VerbsPair::isend(Request* r) {
  std::lock_guard<std::mutex> g(t_->drive_mu_);
  r->peer = peer_;
  if (failed_ || peer_closed_) return r->fail(Request::kPeerFailure, fail_reason_);
  if (closing_) return r->fail(Request::kPeerFailure, closing_reason_);
  r->tp_word = send_seq_++;
  r->tp_private = nullptr;
  sendq_.push_back(r);
  pump();
}

void VerbsPair::irecv(Request* r) {
  std::lock_guard<std::mutex> g(t_->drive_mu_);
  r->peer = peer_;
  if (peer_closed_ && !failed_ && !unexpected_eager_.empty() && unexpected_eager_.front().first == recv_seq_) {
    // The peer sent this before closing; it is in our ring.
    RecvEntry e{r, nullptr, false};
    r->tp_word = recv_seq_++;
    uint32_t slot = unexpected_eager_.front().second;
    unexpected_eager_.pop_front();
    return deliverEager(r->tp_word, slot, e);
  }
  if (failed_ || peer_closed_) return r->fail(Request::kPeerFailure, fail_reason_);
  if (closing_) return r->fail(Request::kPeerFailure, closing_reason_);
  uint64_t seq = recv_seq_++;
  r->tp_word = seq;
  RecvEntry e{r, nullptr, false};
  if (!unexpected_eager_.empty() && unexpected_eager_.front().first == seq) {
    uint32_t slot = unexpected_eager_.front().second;
    unexpected_eager_.pop_front();
    deliverEager(seq, slot, e);
    pump();
    return;
  }
  auto rts = early_rts_.find(seq);
  if (rts != early_rts_.end()) {
    Ctrl c = rts->second;
    early_rts_.erase(rts);
    if (!checkHeader(seq, c.tag, c.len, e)) return;
  }
  if (r->len > t_->eager_max_) {
    sendRtr(seq, e);
    if (failed_ || closing_ || r->done()) return;
  }
  recvs_.emplace(seq, e);
  pump();
}

// ---------------------------------------------------------------------------
// Sending side

bool VerbsPair::announce(Request* r) {
  uint64_t seq = r->tp_word;
  if (r->len <= t_->eager_max_) {
    // An RTR for this number means the receiver expects a larger message; it
    // will see the mismatch in the eager header.
    early_rtrs_.erase(seq);
    return postEager(r);
  }
  Ctrl c{};
  c.kind = kRts;
  c.seq = seq;
  c.tag = r->tag;
  c.len = r->len;
  if (!ctrl_out_.empty() || !postCtrl(c, /*credited=*/true, false)) return false;
  auto it = early_rtrs_.find(seq);
  if (it != early_rtrs_.end()) {
    Ctrl rtr = it->second;
    early_rtrs_.erase(it);
    startRendezvous(r, rtr);
  } else {
    waiting_rtr_.emplace(seq, r);
  }
  return true;
}

void VerbsPair::onRtr(const Ctrl& c) {
  auto it = waiting_rtr_.find(c.seq);
  if (it != waiting_rtr_.end()) {
    Request* r = it->second;
    waiting_rtr_.erase(it);
    return startRendezvous(r, c);
  }
  uint64_t first_unannounced = sendq_.empty() ? send_seq_ : sendq_.front()->tp_word;
  if (c.seq < first_unannounced) return;  // that message went eagerly; the receiver reports the mismatch
  early_rtrs_.emplace(c.seq, c);
}

void VerbsPair::startRendezvous(Request* r, const Ctrl& rtr) {
  if (rtr.tag != r->tag || rtr.len != r->len) {
    waiting_rtr_.emplace(r->tp_word, r);  // fail() fails it with the others
    Ctrl m{};
    m.seq = r->tp_word;
    m.tag = r->tag;
    m.len = r->len;
    m.addr = 0;  // from the sending side
    closeWithNotice(kMismatch, "",
                    "collective mismatch with " + who() + ": message #" + std::to_string(rtr.seq) + " is " +
                        std::to_string(r->len) + " bytes here, but " + who() + " posted a receive of " +
                        std::to_string(rtr.len) + " bytes (tags " + std::to_string(r->tag) + " vs " +
                        std::to_string(rtr.tag) + ")",
                    &m);
    return;
  }
  MrEntry* mr = nullptr;
  try {
    mr = t_->mrs_->acquire(r->buf, r->len, /*write=*/false);
  } catch (const Error& e) {
    waiting_rtr_.emplace(r->tp_word, r);
    closeWithNotice(kAbort, "rank " + std::to_string(t_->info_.rank) + " could not register a send buffer", e.what());
    return;
  }
  auto op = std::make_unique<SendOp>();
  op->req = r;
  op->mr = mr;
  op->seq = rtr.seq;
  op->raddr = rtr.addr;
  op->rkey = rtr.rkey;
  op->offset = 0;
  ops_.push_back(std::move(op));
}

// ---------------------------------------------------------------------------
// Receiving side

void VerbsPair::sendRtr(uint64_t seq, RecvEntry& e) {
  Request* r = e.req;
  try {
    e.mr = t_->mrs_->acquire(r->buf, r->len, /*write=*/true);
  } catch (const Error& err) {
    // The peer will send this message anyway; the pair is out of step.
    r->fail(Request::kLocal, err.what());
    closeWithNotice(kAbort, "rank " + std::to_string(t_->info_.rank) + " could not register a receive buffer",
                    err.what());
    return;
  }
  Ctrl c{};
  c.kind = kRtr;
  c.seq = seq;
  c.tag = r->tag;
  c.len = r->len;
  c.addr = reinterpret_cast<uintptr_t>(r->buf);
  c.rkey = e.mr->mr->rkey;
  ctrl_out_.push_back(c);
  e.rtr_sent = true;
}

// True when the incoming message (tag, len) matches receive `e`; otherwise
// fails it with kMismatch, tells the sender, and closes the pair.
bool VerbsPair::checkHeader(uint64_t seq, uint64_t tag, uint64_t len, RecvEntry& e) {
  Request* r = e.req;
  if (tag == r->tag && len == r->len) return true;
  r->peer_tag = tag;
  r->peer_len = len;
  if (e.mr) t_->mrs_->invalidate(e.mr);
  e.mr = nullptr;
  r->fail(Request::kMismatch, "message from " + who() + " does not match the posted receive");
  Ctrl m{};
  m.seq = seq;
  m.tag = r->tag;
  m.len = r->len;
  m.addr = 1;  // from the receiving side
  closeWithNotice(kMismatch, "", "stream from " + who() + " out of step after a collective mismatch", &m);
  return false;
}

void VerbsPair::onEagerData(uint32_t slot) {
  if (slot != eager_rx_next_) return protocolError("eager slot " + std::to_string(slot) + " written out of order");
  eager_rx_next_ = (slot + 1) % static_cast<uint32_t>(t_->eager_slots_);
  EagerHdr h;
  std::memcpy(&h, eager_rx_.data() + slot * (sizeof(EagerHdr) + t_->eager_max_), sizeof h);
  auto it = recvs_.find(h.seq);
  if (it != recvs_.end()) {
    RecvEntry e = it->second;
    recvs_.erase(it);
    return deliverEager(h.seq, slot, e);
  }
  if (h.seq < recv_seq_) return protocolError("eager message #" + std::to_string(h.seq) + " has no receive");
  unexpected_eager_.emplace_back(h.seq, slot);  // waits in the ring for its irecv
}

void VerbsPair::deliverEager(uint64_t seq, uint32_t slot, RecvEntry& e) {
  const char* p = eager_rx_.data() + slot * (sizeof(EagerHdr) + t_->eager_max_);
  EagerHdr h;
  std::memcpy(&h, p, sizeof h);
  ++eager_to_return_;  // the slot is free once this returns
  if (h.len > t_->eager_max_) return protocolError("eager message of " + std::to_string(h.len) + " bytes");
  if (!checkHeader(seq, h.tag, h.len, e)) return;
  if (h.len) std::memcpy(e.req->buf, p + sizeof h, h.len);
  if (e.mr) t_->mrs_->release(e.mr);
  e.req->complete();
}

void VerbsPair::onRts(const Ctrl& c) {
  auto it = recvs_.find(c.seq);
  if (it != recvs_.end()) {
    if (c.tag == it->second.req->tag && c.len == it->second.req->len) return;  // RTR went out at irecv
    RecvEntry e = it->second;
    recvs_.erase(it);
    checkHeader(c.seq, c.tag, c.len, e);
    return;
  }
  if (c.seq < recv_seq_) return protocolError("announcement for message #" + std::to_string(c.seq) + " has no receive");
  early_rts_.emplace(c.seq, c);
}

void VerbsPair::onMismatchNotice(const Ctrl& c) {
  if (c.addr == 1) {
    // The receiver found that our message #seq does not match its receive.
    return fail("collective mismatch with " + who() + ": it posted a receive of " + std::to_string(c.len) +
                " bytes (tag " + std::to_string(c.tag) + ") for message #" + std::to_string(c.seq) +
                " that this rank sent with a different length or tag");
  }
  auto it = recvs_.find(c.seq);
  if (it != recvs_.end()) {
    RecvEntry e = it->second;
    recvs_.erase(it);
    if (e.mr) t_->mrs_->invalidate(e.mr);
    e.req->peer_tag = c.tag;
    e.req->peer_len = c.len;
    e.req->fail(Request::kMismatch, "message from " + who() + " does not match the posted receive");
  }
  fail("stream from " + who() + " out of step after a collective mismatch");
}

}  // namespace harp::transport::verbs
