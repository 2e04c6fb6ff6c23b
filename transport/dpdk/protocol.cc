// transport/dpdk/protocol.cc — the reliable protocol state machine (see
// protocol.h for the threading rule and PROTOCOL.md for the specification).
#include "transport/dpdk/protocol.h"

#include <algorithm>
#include <cstdio>

#include "base/log.h"
#include "bootstrap/socket.h"

namespace harp::dpdk {

using transport::Request;

void PayloadView::copyTo(uint8_t* dst, uint32_t len) const {
  for (int i = 0; i < segs && len > 0; i++) {
    uint32_t c = std::min(n[i], len);
    std::memcpy(dst, p[i], c);
    dst += c;
    len -= c;
  }
}

Protocol::Protocol(uint64_t comm_id, int rank, int size, FrameIO* io, ProtocolConfig cfg)
    : comm_id_(comm_id), rank_(rank), size_(size), io_(io), cfg_(cfg), peers_(size) {
  cfg_.window = std::clamp(cfg_.window, 1, kSackBits);
}

Protocol::~Protocol() = default;

void Protocol::setPeer(int peer, uint32_t max_payload) {
  Peer& p = peers_[peer];
  p.max_payload = max_payload;
  p.ring.assign(cfg_.window, InFlight{});
  p.rto_ns = std::max<uint64_t>(cfg_.rto_min_ns, 10'000'000);
  p.last_progress_ns = p.last_heard_ns = nowNs();
  active_.push_back(peer);
}

// ---------------------------------------------------------------- posting
void Protocol::isend(int peer, Request* r) {
  Peer& p = peers_[peer];
  if (p.failed) return r->fail(Request::kPeerFailure, p.fail_why);
  if (r->len <= cfg_.eager_bytes && r->len <= p.max_payload) {
    // Small: send from a copy and complete the user's request now.
    while (!p.eager.empty() && p.eager.front()->req.done()) {  // acknowledged (or failed): reusable
      p.eager_free.push_back(std::move(p.eager.front()));
      p.eager.pop_front();
    }
    if (p.eager_free.empty()) p.eager_free.push_back(std::make_unique<EagerSend>());
    EagerSend* e = p.eager.emplace_back(std::move(p.eager_free.back())).get();
    p.eager_free.pop_back();
    const uint8_t* src = static_cast<const uint8_t*>(r->buf);
    e->bytes.assign(src, src + r->len);
    e->req = Request{};
    e->req.buf = e->bytes.data();
    e->req.len = r->len;
    e->req.tag = r->tag;
    e->req.peer = r->peer;
    r->complete();
    r = &e->req;
  }
  r->offset = 0;  // packets acknowledged
  r->tp_word = r->len == 0 ? 1 : (r->len + p.max_payload - 1) / p.max_payload;  // packets total
  if (p.snd_una == p.snd_nxt && p.sendq.empty()) p.last_progress_ns = nowNs();
  p.sendq.push_back(SendMsg{r, p.next_msg_seq++});
  moved_ = true;
}

void Protocol::irecv(int peer, Request* r) {
  Peer& p = peers_[peer];
  uint32_t m = p.recv_base + static_cast<uint32_t>(p.recvq.size());
  if (p.failed && !p.staged.count(m)) return r->fail(Request::kPeerFailure, p.fail_why);
  p.recvq.push_back(RecvSlot{r});
  RecvSlot& s = p.recvq.back();
  auto it = p.staged.find(m);
  if (it != p.staged.end()) {
    Staged& st = it->second;
    checkRecvHeader(p, peer, s, st.tag, st.msg_len);  // fails the request unless msg_len == r->len
    for (auto& [off, bytes] : st.chunks) {
      // Each chunk was checked to lie within msg_len when it was staged; the
      // bound is checked again against the buffer itself.
      if (!s.done && off <= r->len && bytes.size() <= r->len - off)
        std::memcpy(static_cast<uint8_t*>(r->buf) + off, bytes.data(), bytes.size());
      s.got += bytes.size();
    }
    p.staged_bytes -= st.bytes;
    p.staged.erase(it);
    if (!s.done && s.got >= s.msg_len) {
      s.done = true;
      r->complete();
    }
    finishRecvs(p);
  }
  if (p.want_retx && !p.failed) {  // we dropped data for lack of a posted buffer: ask for it now
    p.want_retx = false;
    sendAck(p, peer, kFlagWant);
  }
  moved_ = true;
}

// ---------------------------------------------------------------- sending
// Space for a frame to `peer` with the common header fields filled in
// (nullptr when no buffer is free right now); the caller adds the rest and commits.
WireHdr* Protocol::startFrame(int peer, PktType type, uint8_t flags, size_t payload) {
  uint8_t* b = io_->begin(peer, payload);
  if (!b) return nullptr;
  WireHdr* h = reinterpret_cast<WireHdr*>(b);
  std::memset(h, 0, sizeof *h);
  h->magic = kMagic;
  h->version = kVersion;
  h->type = static_cast<uint8_t>(type);
  h->flags = flags;
  h->comm_id = comm_id_;
  h->src_rank = rank_;
  h->dst_rank = peer;
  h->payload_len = static_cast<uint32_t>(payload);
  return h;
}

bool Protocol::sendData(Peer& p, int peer, uint32_t seq, InFlight& f, bool retx) {
  WireHdr* h = startFrame(peer, PktType::kData, f.flags, f.len);
  if (!h) return false;
  uint8_t* b = reinterpret_cast<uint8_t*>(h);
  h->seq = seq;
  h->msg_seq = f.msg_seq;
  h->offset = f.offset;
  h->flags |= kFlagAck;  // piggybacked cumulative ack: spares the peer most ACK frames
  h->ack = p.rcv_nxt;
  p.piggy_nxt = p.rcv_nxt;
  p.piggy_valid = true;
  h->tag = f.req->tag;
  h->msg_len = f.req->len;
  if (f.len) std::memcpy(b + kHdrLen, static_cast<const uint8_t*>(f.req->buf) + f.offset, f.len);
  io_->commit(peer, f.len);
  f.sent_ns = nowNs();
  if (retx) {
    f.retx++;
    stats_.retx++;
  } else {
    stats_.data_tx++;
  }
  return true;
}

void Protocol::sendAck(Peer& p, int peer, uint8_t flags) {
  WireHdr* h = startFrame(peer, PktType::kAck, flags, sizeof p.rcv_sack);
  if (!h) return;  // retried on the next tick (ack_due stays set)
  h->seq = p.rcv_nxt;
  std::memcpy(reinterpret_cast<uint8_t*>(h) + kHdrLen, p.rcv_sack, sizeof p.rcv_sack);
  io_->commit(peer, sizeof p.rcv_sack);
  p.ack_due = p.ack_now = false;
  stats_.acks_tx++;
}

void Protocol::broadcastControl(PktType type, const std::string& text) {
  for (int peer : active_) {
    Peer& p = peers_[peer];
    size_t n = std::min<size_t>(text.size(), std::min<uint32_t>(p.max_payload, 1000));
    for (int copy = 0; copy < 3; copy++) {  // unreliable: send a few copies
      WireHdr* h = startFrame(peer, type, 0, n);
      if (!h) break;
      h->seq = p.rcv_nxt;  // BYE doubles as a final cumulative ack
      std::memcpy(reinterpret_cast<uint8_t*>(h) + kHdrLen, text.data(), n);
      io_->commit(peer, n);
    }
  }
}

void Protocol::sendHello(int peer, const std::string& body, uint8_t flags) {
  // Padded to the pair's full payload size: if full-size frames do not get
  // through (an MTU the path cannot carry), the handshake fails and says so
  // instead of the first large message stalling.
  uint32_t pad = std::max<uint32_t>(peers_[peer].max_payload, static_cast<uint32_t>(body.size()));
  WireHdr* h = startFrame(peer, PktType::kHello, flags, pad);
  if (!h) return;
  h->tag = kHelloAuthVersion;
  uint8_t* pl = reinterpret_cast<uint8_t*>(h) + kHdrLen;
  std::memset(pl, 0, pad);
  std::memcpy(pl, body.data(), body.size());
  io_->commit(peer, pad);
}

void Protocol::sendPing(int peer) {
  if (startFrame(peer, PktType::kPing, 0, 0)) io_->commit(peer, 0);
}

void Protocol::ackedEntry(Peer& p, InFlight& f, uint64_t now, bool sample_rtt) {
  if (!f.req) return;
  if (sample_rtt && f.retx == 0) {  // Karn: only unambiguous samples
    uint64_t rtt = now - f.sent_ns;
    if (p.srtt_ns == 0) {
      p.srtt_ns = rtt;
      p.rttvar_ns = rtt / 2;
    } else {
      uint64_t d = rtt > p.srtt_ns ? rtt - p.srtt_ns : p.srtt_ns - rtt;
      p.rttvar_ns = (3 * p.rttvar_ns + d) / 4;
      p.srtt_ns = (7 * p.srtt_ns + rtt) / 8;
    }
    p.rto_ns = std::clamp<uint64_t>(p.srtt_ns + 4 * p.rttvar_ns, cfg_.rto_min_ns, cfg_.rto_max_ns);
  }
  Request* r = f.req;
  f.req = nullptr;
  if (++r->offset == r->tp_word && !r->done()) r->complete();
  moved_ = true;
}

int Protocol::retransmitDue(Peer& p, int peer, uint64_t now, uint64_t older_than_ns, int budget) {
  int sent = 0;
  for (uint32_t s = p.snd_una; s != p.snd_nxt && sent < budget; s++) {
    InFlight& f = p.ring[s % cfg_.window];
    if (!f.req || f.sacked || now - f.sent_ns < older_than_ns) continue;
    if (!sendData(p, peer, s, f, true)) break;
    sent++;
  }
  return sent;
}

// Everything below `cum` is acknowledged (from an ACK, or piggybacked on DATA).
void Protocol::advanceCumulative(Peer& p, uint32_t cum, uint64_t now) {
  if (seqLt(p.snd_una, cum) && !seqLt(p.snd_nxt, cum)) {
    for (uint32_t s = p.snd_una; s != cum; s++) {
      InFlight& f = p.ring[s % cfg_.window];
      if (!f.sacked) ackedEntry(p, f, now, true);
      f.req = nullptr;
      f.sacked = false;
    }
    p.snd_una = cum;
    p.last_progress_ns = now;
    p.backoff = 0;
  }
  if (p.snd_una == p.snd_nxt) p.last_progress_ns = now;
}

void Protocol::onAck(Peer& p, int peer, const WireHdr& h, const PayloadView& pl) {
  stats_.acks_rx++;
  uint64_t now = nowNs();
  uint32_t cum = h.seq;
  advanceCumulative(p, cum, now);
  uint64_t sack[kSackBits / 64] = {0, 0, 0, 0};
  if (pl.total >= sizeof sack) pl.copyTo(reinterpret_cast<uint8_t*>(sack), sizeof sack);
  bool any_sack = false;
  uint32_t highest = cum;
  for (int i = 0; i < kSackBits; i++) {
    if (!(sack[i / 64] >> (i % 64) & 1)) continue;
    uint32_t s = cum + 1 + i;
    if (seqLt(s, p.snd_una) || !seqLt(s, p.snd_nxt)) continue;
    InFlight& f = p.ring[s % cfg_.window];
    if (!f.sacked && f.req) {
      ackedEntry(p, f, now, true);
      f.sacked = true;
    }
    any_sack = true;
    highest = s;
  }
  if (h.flags & kFlagWant) {
    // The receiver dropped data it had no room for and now has a buffer.
    p.backoff = 0;
    retransmitDue(p, peer, now, 0, cfg_.window);
  } else if (p.snd_una != p.snd_nxt && now - p.ring[p.snd_una % cfg_.window].sent_ns >= p.rto_ns) {
    // Recovery after a timeout: the ack clock drives the next few resends.
    retransmitDue(p, peer, now, p.rto_ns, kRecoveryBurst);
  }
  if (any_sack && !(h.flags & kFlagWant)) {
    // Fast retransmit: holes below the highest selectively acked packet that
    // have been out for longer than a reordering allowance.
    uint64_t allowance = std::max<uint64_t>(p.srtt_ns / 2, 200'000);
    for (uint32_t s = p.snd_una; seqLt(s, highest); s++) {
      InFlight& f = p.ring[s % cfg_.window];
      if (!f.req || f.sacked || now - f.sent_ns < allowance) continue;
      if (!sendData(p, peer, s, f, true)) break;
    }
  }
}

// ---------------------------------------------------------------- receiving
bool Protocol::sackHas(const Peer& p, uint32_t seq) const {
  int i = seqDiff(seq, p.rcv_nxt) - 1;
  return i >= 0 && i < kSackBits && (p.rcv_sack[i / 64] >> (i % 64) & 1);
}

void Protocol::sackSet(Peer& p, uint32_t seq) {
  int i = seqDiff(seq, p.rcv_nxt) - 1;
  if (i >= 0 && i < kSackBits) p.rcv_sack[i / 64] |= 1ull << (i % 64);
}

void Protocol::sackShift(Peer& p) {
  for (int w = 0; w < kSackBits / 64; w++) {
    p.rcv_sack[w] >>= 1;
    if (w + 1 < kSackBits / 64) p.rcv_sack[w] |= (p.rcv_sack[w + 1] & 1) << 63;
  }
}

void Protocol::checkRecvHeader(Peer& p, int peer, RecvSlot& s, uint64_t tag, uint64_t len) {
  s.known = true;
  s.msg_len = len;
  s.tag = tag;
  Request* r = s.req;
  if (tag != r->tag || len != r->len) {
    r->peer_tag = tag;
    r->peer_len = len;
    char why[256];
    snprintf(why, sizeof why,
             "message from rank %d does not match the posted receive: it has tag 0x%llx and %llu bytes, "
             "this rank expected tag 0x%llx and %zu bytes",
             peer, (unsigned long long)tag, (unsigned long long)len, (unsigned long long)r->tag, r->len);
    s.done = true;
    r->fail(Request::kMismatch, why);
    moved_ = true;
  }
}

void Protocol::finishRecvs(Peer& p) {
  while (!p.recvq.empty() && p.recvq.front().done && p.recvq.front().known &&
         p.recvq.front().got >= p.recvq.front().msg_len) {
    p.recvq.pop_front();
    p.recv_base++;
  }
}

void Protocol::malformed(int peer, const WireHdr& h, const char* why) {
  stats_.malformed++;
  if (malformed_logged_ >= 5) return;
  malformed_logged_++;
  HARP_WARN("dpdk: dropping a DATA frame claiming rank %d of communicator %016llx: %s (message %u, offset %llu, "
            "%u bytes, message length %llu)%s",
            peer, (unsigned long long)comm_id_, why, h.msg_seq, (unsigned long long)h.offset, h.payload_len,
            (unsigned long long)h.msg_len, malformed_logged_ == 5 ? "; further ones are only counted" : "");
}

// The header passed dataHeaderProblem: its payload lies within [0, msg_len).
bool Protocol::placeData(Peer& p, int peer, const WireHdr& h, const PayloadView& pl) {
  int32_t idx = seqDiff(h.msg_seq, p.recv_base);
  if (idx < 0) return true;  // message already finished (only after a mismatch): discard
  if (idx >= static_cast<int32_t>(p.recvq.size())) return stage(p, peer, h, pl);
  RecvSlot& s = p.recvq[idx];
  if (!s.known) {
    checkRecvHeader(p, peer, s, h.tag, h.msg_len);  // fails the request unless msg_len == its length
  } else if (h.tag != s.tag || h.msg_len != s.msg_len) {
    malformed(peer, h, "tag or message length differ from the message's earlier packets");
    return false;
  }
  const uint32_t n = h.payload_len;
  if (!s.done && h.offset <= s.req->len && n <= s.req->len - h.offset)
    pl.copyTo(static_cast<uint8_t*>(s.req->buf) + h.offset, n);  // straight to its place
  s.got += n;
  if (!s.done && s.got >= s.msg_len) {
    s.done = true;
    s.req->complete();
    moved_ = true;
  }
  finishRecvs(p);
  return true;
}

// No receive posted yet for this message: keep the bytes, within the peer's
// staging bounds (bytes with bookkeeping, and messages).
bool Protocol::stage(Peer& p, int peer, const WireHdr& h, const PayloadView& pl) {
  uint64_t ahead = static_cast<uint64_t>(seqDiff(h.msg_seq, p.recv_base)) - p.recvq.size();
  if (ahead >= cfg_.stage_msgs + kSackBits) {  // more messages in between than could be in flight or staged
    malformed(peer, h, "message number too far ahead of the posted receives");
    return false;
  }
  auto it = p.staged.find(h.msg_seq);
  if (it != p.staged.end() && (it->second.tag != h.tag || it->second.msg_len != h.msg_len)) {
    malformed(peer, h, "tag or message length differ from the message's earlier packets");
    return false;
  }
  const uint32_t n = h.payload_len;
  if (it != p.staged.end() && n > 0 && it->second.chunks.count(h.offset)) return true;  // have it
  size_t cost = (n > 0 ? n + kStageOverhead : 0) + (it == p.staged.end() ? kStageOverhead : 0);
  if (p.staged_bytes + cost > cfg_.stage_bytes || (it == p.staged.end() && p.staged.size() >= cfg_.stage_msgs)) {
    p.want_retx = true;  // the next irecv asks for it again
    stats_.stage_drops++;
    return false;
  }
  if (it == p.staged.end()) it = p.staged.emplace(h.msg_seq, Staged{h.tag, h.msg_len, {}, 0}).first;
  Staged& st = it->second;
  if (n > 0) {
    std::vector<uint8_t>& bytes = st.chunks[h.offset];
    bytes.resize(n);
    pl.copyTo(bytes.data(), n);
  }
  st.bytes += cost;
  p.staged_bytes += cost;
  stats_.staged++;
  return true;
}

void Protocol::onData(Peer& p, int peer, const WireHdr& h, const PayloadView& pl) {
  int32_t d = seqDiff(h.seq, p.rcv_nxt);
  if (d < 0 || (d > 0 && sackHas(p, h.seq))) {  // duplicate: re-acknowledge
    stats_.dup_rx++;
    p.ack_due = p.ack_now = true;
    return;
  }
  if (d >= kSackBits) return;  // beyond any legal window: ignore
  if (!placeData(p, peer, h, pl)) return;
  stats_.data_rx++;
  if (d == 0) {
    for (;;) {
      bool next_have = p.rcv_sack[0] & 1;
      sackShift(p);
      p.rcv_nxt++;
      if (!next_have) break;
    }
  } else {
    sackSet(p, h.seq);
    stats_.ooo_rx++;
    p.ack_now = true;
  }
  p.ack_due = true;
  moved_ = true;
}

void Protocol::onFrame(const WireHdr& h, const PayloadView& pl) {
  int peer = static_cast<int>(h.src_rank);
  if (peer < 0 || peer >= size_ || peer == rank_) return;
  Peer& p = peers_[peer];
  if (p.ring.empty()) return;  // not a peer of this transport
  if (h.channel != 0) return;  // version 1 has channel 0 only
  if (!p.verified && h.type != static_cast<uint8_t>(PktType::kHello)) {
    stats_.unproven++;  // it has not proved the token yet: nothing of it counts
    return;
  }
  if (h.type == static_cast<uint8_t>(PktType::kData)) {
    if (const char* why = dataHeaderProblem(h, pl.total)) return malformed(peer, h, why);
  }
  p.last_heard_ns = nowNs();
  switch (static_cast<PktType>(h.type)) {
    case PktType::kData:
      if (!p.failed && (h.flags & kFlagAck)) advanceCumulative(p, h.ack, p.last_heard_ns);
      if (!p.failed) onData(p, peer, h, pl);
      break;
    case PktType::kAck:
      if (!p.failed) onAck(p, peer, h, pl);
      break;
    case PktType::kPing:
      p.ack_due = true;
      break;
    case PktType::kBye: {
      WireHdr a = h;  // its cumulative ack first
      a.flags = 0;
      if (!p.failed) onAck(p, peer, a, PayloadView{});
      [[fallthrough]];
    }
    case PktType::kHello:
    case PktType::kAbort: {
      Control c{static_cast<PktType>(h.type), peer, h.flags, h.tag, {}};
      // ABORT/BYE: the text; HELLO: the nonces and proof at its start.
      uint32_t keep = h.type == static_cast<uint8_t>(PktType::kHello) ? kHelloBodyBytes : h.payload_len;
      c.text.resize(std::min<uint32_t>(pl.total, std::min(keep, h.payload_len)));
      pl.copyTo(reinterpret_cast<uint8_t*>(c.text.data()), c.text.size());
      controls_.push_back(std::move(c));
      break;
    }
  }
}

// ---------------------------------------------------------------- timers + tx
bool Protocol::tick() {
  uint64_t now = nowNs();
  for (int peer : active_) {
    Peer& p = peers_[peer];
    if (p.failed) continue;
    // 1. Retransmission timeout on the oldest unacknowledged packet.
    if (p.snd_una != p.snd_nxt) {
      InFlight& oldest = p.ring[p.snd_una % cfg_.window];
      uint64_t rto = std::min<uint64_t>(p.rto_ns << std::min(p.backoff, 10), cfg_.rto_max_ns);
      if (oldest.req && !oldest.sacked && now - oldest.sent_ns >= rto) {
        // Resend a few of the oldest (not the whole window: a late ack is far
        // more likely here than a lost window); acks then clock out the rest.
        stats_.timeouts++;
        p.backoff++;
        retransmitDue(p, peer, now, rto, kRecoveryBurst);
      }
      if (now - p.last_progress_ns > cfg_.peer_timeout_ns) {
        failPeer(peer, "rank " + std::to_string(peer) + " stopped acknowledging data over the dpdk transport for " +
                           formatSeconds(cfg_.peer_timeout_ns / 1e9) + " s");
        continue;
      }
    }
    // 2. New data, as far as the window allows.
    int burst = 0;
    while (!p.sendq.empty() && seqDiff(p.snd_nxt, p.snd_una) < cfg_.window && burst < cfg_.max_burst) {
      SendMsg& m = p.sendq.front();
      uint64_t left = m.req->len - m.next_off;
      if (left == 0 && m.started) {
        p.sendq.pop_front();
        continue;
      }
      InFlight& f = p.ring[p.snd_nxt % cfg_.window];
      f = InFlight{};
      f.req = m.req;
      f.msg_seq = m.msg_seq;
      f.offset = m.next_off;
      f.len = static_cast<uint32_t>(std::min<uint64_t>(left, p.max_payload));
      f.flags = (m.next_off == 0 ? kFlagFirst : 0) | (m.next_off + f.len == m.req->len ? kFlagLast : 0);
      if (!sendData(p, peer, p.snd_nxt, f, false)) {
        f.req = nullptr;
        break;
      }
      p.snd_nxt++;
      m.next_off += f.len;
      m.started = true;
      burst++;
      if (m.next_off == m.req->len) p.sendq.pop_front();
      moved_ = true;
    }
    // 3. Acknowledgements owed, unless data sent this tick carried the same
    // cumulative ack and there is nothing selective to report.
    if (p.ack_due && !p.ack_now && p.piggy_valid && p.piggy_nxt == p.rcv_nxt) p.ack_due = false;
    p.piggy_valid = false;
    if (p.ack_due) sendAck(p, peer, 0);
  }
  bool m = moved_;
  moved_ = false;
  return m;
}

bool Protocol::peerBusy(int peer) const {
  const Peer& p = peers_[peer];
  if (p.sending()) return true;
  for (const auto& s : p.recvq)
    if (!s.done) return true;
  return false;
}

bool Protocol::hasUnackedSends() const {
  for (int peer : active_) {
    const Peer& p = peers_[peer];
    if (!p.failed && p.sending()) return true;
  }
  return false;
}

bool Protocol::hasPending() const {
  for (int peer : active_)
    if (peerBusy(peer)) return true;
  return false;
}

void Protocol::failPeer(int peer, const std::string& why, bool keep_arrived) {
  Peer& p = peers_[peer];
  if (!p.failed) {
    p.failed = true;
    p.fail_why = why;
  }
  for (auto& f : p.ring) {
    if (f.req && !f.req->done()) f.req->fail(Request::kPeerFailure, p.fail_why);
    f.req = nullptr;
  }
  for (auto& m : p.sendq)
    if (!m.req->done()) m.req->fail(Request::kPeerFailure, p.fail_why);
  p.sendq.clear();
  for (auto& s : p.recvq)
    if (!s.done) {
      s.done = true;
      s.req->fail(Request::kPeerFailure, p.fail_why);
    }
  p.recv_base += static_cast<uint32_t>(p.recvq.size());  // staged messages keep their numbers
  p.recvq.clear();
  if (!keep_arrived) {
    p.staged.clear();
    p.staged_bytes = 0;
  }
  p.snd_una = p.snd_nxt;
  moved_ = true;
}

}  // namespace harp::dpdk
