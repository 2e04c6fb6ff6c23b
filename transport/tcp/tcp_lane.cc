// transport/tcp/tcp_lane.cc — TcpPair: one peer's lanes, adaptive striping,
// frame reading and the checks of tcp_wire.h.
//
// Send: isend queues the message (sends_, numbered in posting order).
// progressSend lets each lane finish the piece it owns, then offers the next
// piece of the oldest message to the free lane with the shortest kernel queue
// (SIOCOUTQ: bytes not yet acknowledged); the piece is that lane's once the
// kernel accepts its first byte. Pieces thus flow to whichever lanes drain
// fastest. A request completes when all its pieces are in the kernel.
//
// Receive: irecv appends a RecvSlot. Each lane reads a 40-byte header, finds
// the slot by message number (a lane whose header names a message not yet
// posted stalls until it is; lanes carry non-decreasing numbers, so that never
// blocks an earlier message), checks kind, flags, offset, tag and length and
// that the piece is new, then reads the payload straight into the posted
// buffer. A slot completes when all its bytes are placed; slots complete out of
// order across lanes but the caller's matching is by posting order.
//
// One-lane pairs read a frame's header and payload with one readv when the
// oldest posted receive is untouched (frames arrive in order there).
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/log.h"
#include "transport/tcp/tcp.h"

namespace harp::transport::tcp {

using namespace tcpwire;

TcpPair::TcpPair(TcpTransport* t, int peer, int lanes) : t_(t), peer_(peer), lanes_(lanes) {}

TcpPair::~TcpPair() {
  for (auto& l : lanes_)
    if (l.fd >= 0) ::close(l.fd);
}

std::string TcpPair::who() const { return t_->rankName(peer_); }

bool TcpPair::anyLaneSending() const {
  for (auto& l : lanes_)
    if (l.sreq) return true;
  return false;
}

bool TcpPair::wantsIn(size_t i) const {
  const Lane& l = lanes_[i];
  return !failed_ && !l.eof && !l.stalled;
}

bool TcpPair::wantsOut(size_t i) const {
  return !failed_ && (lanes_[i].sreq || !sends_.empty() || lanes_[i].heldLeft());
}

void TcpPair::dropLanes(int keep) {
  for (size_t i = keep; i < lanes_.size(); ++i)
    if (lanes_[i].fd >= 0) ::close(lanes_[i].fd);
  lanes_.resize(keep);
}

void TcpPair::isend(Request* r) {
  std::lock_guard<std::mutex> drive(t_->drive_mu_);  // vs. abort() from the keep-alive thread
  r->peer = peer_;
  if (!up_ && !dialed_ && !failed_ && peer_ < t_->info_.rank) t_->dialPeer(*this);  // lazy set-up
  if (failed_) return r->fail(Request::kPeerFailure, fail_reason_);
  if (peer_closed_) return r->fail(Request::kPeerFailure, who() + " has already closed its communicator");
  bool striped = lanes_.size() > 1 && r->len >= t_->stripe_min_;
  r->tp_word = striped ? chunkCount(r->len, t_->chunk_) : 1;
  sends_.push_back({r, send_seq_++, 0, striped});
}

// After the peer's goodbye a receive may still be posted: its message may
// be on a lane not read to its end yet (progress fails it once every lane is).
void TcpPair::irecv(Request* r) {
  std::lock_guard<std::mutex> drive(t_->drive_mu_);  // vs. abort() from the keep-alive thread
  r->peer = peer_;
  if (!up_ && !dialed_ && !failed_ && peer_ < t_->info_.rank) t_->dialPeer(*this);  // lazy set-up
  if (failed_) return r->fail(Request::kPeerFailure, fail_reason_);
  slots_.emplace_back();
  slots_.back().req = r;
  ++recv_next_;
}

void TcpPair::failAll(Request::Failure f, const std::string& why) {
  if (!failed_) {
    failed_ = true;
    fail_reason_ = why;
  }
  for (auto& m : sends_)
    if (!m.req->done()) m.req->fail(f, why);
  for (auto& l : lanes_) {
    if (l.sreq && !l.sreq->done()) l.sreq->fail(f, why);
    if (l.sreq && l.committed) l.mid_frame = true;  // no notice may follow on this lane
    l.sreq = nullptr;
    // Held lazy frames stay: complete frames, sent before an abort notice
    // (sendControl), e.g. the descriptor that tells the root of a mismatch.
  }
  for (auto& s : slots_)  // a complete slot's request may be gone already
    if (!s.complete && !s.req->done()) s.req->fail(f, why);
  sends_.clear();
  slots_.clear();
}

void TcpPair::corrupt(const std::string& what) {
  failAll(Request::kPeerFailure, "corrupt frame from " + who() + ": " + what);
}

// The kernel could not read (send) or write (receive) our own buffer: the
// caller's fault, not the peer's. The stream is out of step afterwards.
void TcpPair::localFault(Request* r, bool sending) {
  char where[64];
  snprintf(where, sizeof where, "%zu bytes at %p", r->len, r->buf);
  r->fail(Request::kLocal, std::string("bad local ") + (sending ? "send" : "receive") + " buffer on rank " +
                               std::to_string(t_->info_.rank) + ": " + where + " is not " +
                               (sending ? "readable" : "writable") + " memory of this process (EFAULT)");
  failAll(Request::kLocal, "connection to " + who() + " abandoned after a bad local buffer on rank " +
                               std::to_string(t_->info_.rank) + " (EFAULT)");
}

void TcpPair::peerGone(const std::string& how) {
  peer_gone_ = true;
  if (failed_) return;
  std::string why = peer_closed_ ? who() + " has closed its communicator"
                                 : who() + " " + how + " (the process died or closed its communicator mid-collective)";
  failAll(Request::kPeerFailure, why);
}

// After a failed send/recv call: true when the caller should just retry later.
bool TcpPair::ioError(ssize_t r, Request* req, bool sending) {
  if (r == 0) {
    peerGone("closed the connection");
    return false;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
  if (errno == EFAULT && req) {
    localFault(req, sending);
    return false;
  }
  peerGone(std::string("reset the connection (") + std::strerror(errno) + ")");
  return false;
}

// ---------------------------------------------------------------------------
// Sending

// Offer the next piece of the oldest message to lane l (not yet committed).
bool TcpPair::assign(Lane& l) {
  if (sends_.empty()) return false;
  SendMsg& m = sends_.front();
  Request* r = m.req;
  uint64_t off = m.next_off, len = r->len;
  uint64_t piece = m.striped ? std::min<uint64_t>(t_->chunk_, len - off) : len;
  l.sreq = r;
  l.shdr = FrameHeader{kData, m.striped ? static_cast<uint32_t>(kStriped) : 0u, m.msg, r->tag, len, off};
  l.shdr_done = 0;
  l.sdata = static_cast<const char*>(r->buf) + off;
  l.slen = piece;
  l.sdone = 0;
  l.committed = false;
  if (!t_->fault_.empty() && m.striped && off == t_->chunk_ && !t_->fault_done_) injectFault(l.shdr);
  return true;
}

// HARP_TCP_FAULT (tests only): corrupt the header of this rank's second
// striped piece, once, so the peer's checks can be seen to fail the pair.
void TcpPair::injectFault(FrameHeader& h) {
  t_->fault_done_ = true;
  const std::string& f = t_->fault_;
  if (f == "offset") h.offset = h.total + t_->chunk_;
  else if (f == "align") h.offset += 1;
  else if (f == "flags") h.flags |= 4;
  else if (f == "kind") h.kind = 0x12345678;
  else if (f == "dup") h.offset = 0;
  HARP_WARN("tcp: HARP_TCP_FAULT=%s: sent a corrupt frame header to %s", f.c_str(), who().c_str());
}

// Write (more of) lane l's piece; a piece not started yet goes after the
// lane's held bytes if they are to go, in the same sendmsg. 1: bytes of the
// piece went (or the piece is done), 0: none did, -1: the pair failed.
int TcpPair::writeLane(Lane& l) {
  iovec iov[3];
  int cnt = 0;
  const bool lead = !l.committed && l.heldLeft();  // held frames come before a piece not started
  size_t lead_n = lead ? l.held.size() - l.held_done : 0;
  if (lead) iov[cnt++] = {l.held.data() + l.held_done, lead_n};
  if (l.shdr_done < sizeof(FrameHeader))
    iov[cnt++] = {reinterpret_cast<char*>(&l.shdr) + l.shdr_done, sizeof(FrameHeader) - l.shdr_done};
  if (l.sdone < l.slen) iov[cnt++] = {const_cast<char*>(l.sdata) + l.sdone, l.slen - l.sdone};
  if (cnt == 0) return 1;
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = cnt;
  ssize_t w = ::sendmsg(l.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w <= 0) {
    if (w == 0) return 0;
    return ioError(w, l.sreq, true) ? 0 : -1;
  }
  size_t wl = std::min<size_t>(w, lead_n);
  l.held_done += wl;
  if (lead && l.held_done == l.held.size()) heldWritten(l);
  w -= wl;
  if (w == 0) return 0;
  size_t wh = std::min<size_t>(w, sizeof(FrameHeader) - l.shdr_done);
  l.shdr_done += wh;
  l.sdone += w - wh;
  return 1;
}

void TcpPair::heldWritten(Lane& l) {
  l.held.clear();
  l.held_done = 0;
  l.held_n = 0;
  l.held_go = false;
}

// Push the held bytes alone (no piece to carry them): as writeLane.
int TcpPair::writeHeld(Lane& l) {
  if (!l.heldLeft()) return 0;
  ssize_t w = ::send(l.fd, l.held.data() + l.held_done, l.held.size() - l.held_done, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w <= 0) {
    if (w == 0) return 0;
    return ioError(w, nullptr, true) ? 0 : -1;
  }
  l.held_done += w;
  if (l.held_done == l.held.size()) heldWritten(l);
  return 1;
}

// Lazy sends at the front of the queue are copied whole (header and payload)
// into lane 0's held bytes and complete at once: nobody waits for them, and
// the lane writes many in one sendmsg. On a pair of several lanes a later
// message may travel on another lane first; the receiver matches by message
// number, so the order of posting holds. True when any was held.
bool TcpPair::holdLazy() {
  Lane& l = lanes_[0];
  bool any = false;
  while (!sends_.empty() && !failed_) {
    SendMsg& m = sends_.front();
    Request* r = m.req;
    if (!r->lazy || m.striped || r->len > kLazyHoldBytes || m.next_off != 0) break;
    FrameHeader h{kData, 0u, m.msg, r->tag, r->len, 0};
    l.held.append(reinterpret_cast<const char*>(&h), sizeof h);
    l.held.append(static_cast<const char*>(r->buf), r->len);
    sends_.pop_front();
    r->complete();
    any = true;
    if (++l.held_n >= kMaxLazyHeld) l.held_go = true;
  }
  if (l.held_n && !l.held_go) t_->any_held_.store(true, std::memory_order_relaxed);
  return any;
}

void TcpPair::pushHeld(bool block) {
  Lane& l = lanes_[0];
  if (failed_ || l.held.size() == l.held_done || l.fd < 0) return;
  l.held_go = true;
  if (l.sreq) {  // held frames follow the piece in flight
    if (!block || l.committed) return;
  }
  if (!block) {
    writeHeld(l);
    return;
  }
  try {
    sendAll(l.fd, l.held.data() + l.held_done, l.held.size() - l.held_done, Deadline::after(1), who());
  } catch (const Error&) {
  }
  heldWritten(l);
}

void TcpPair::pieceWritten(Lane& l) {
  Request* r = l.sreq;
  l.sreq = nullptr;
  l.committed = false;
  if (r->state == Request::kPending && --r->tp_word == 0) r->complete();
}

// Unacknowledged bytes in a lane's kernel queue (SIOCOUTQ): how far behind it is.
static int laneQueue(const Lane& l) {
  int q = 0;
  if (::ioctl(l.fd, SIOCOUTQ, &q) != 0) return 0;
  return q;
}

bool TcpPair::progressSend() {
  bool moved = holdLazy();
  // An unhinted send follows held lazy ones: they go first.
  if (!sends_.empty() && lanes_[0].held_n) lanes_[0].held_go = true;
  // Lanes first finish the pieces they own (lane 0's held bytes after its piece).
  for (auto& l : lanes_) {
    if (!l.sreq || failed_) continue;
    int w = writeLane(l);
    if (w < 0) return true;
    moved |= w > 0;
    if (l.shdr_done == sizeof(FrameHeader) && l.sdone == l.slen) pieceWritten(l);
  }
  Lane& l0 = lanes_[0];
  if (!l0.sreq && l0.heldLeft() && (sends_.empty() || lanes_.size() > 1)) {
    int w = writeHeld(l0);
    if (w < 0) return true;
    moved |= w > 0;
  }
  // Then each new piece goes to the free lane with the shortest kernel queue:
  // a slow or capped lane drains slowly, so it is chosen less often.
  const bool several = lanes_.size() > 1;
  while (!sends_.empty() && !failed_) {
    Lane* best = nullptr;
    int best_q = 0;
    for (auto& l : lanes_) {
      if (l.sreq) continue;
      int q = several ? laneQueue(l) : 0;
      if (!best || q < best_q) best = &l, best_q = q;
    }
    if (!best) break;
    assign(*best);
    const size_t held_before = l0.held.size() - l0.held_done;
    int w = writeLane(*best);
    if (w < 0) return true;
    if (w == 0) {  // the emptiest free lane takes nothing now (its held bytes may have gone); the piece waits
      best->sreq = nullptr;
      moved |= l0.held.size() - l0.held_done != held_before;
      break;
    }
    moved = true;
    best->committed = true;  // the kernel took its first byte: the piece is this lane's
    SendMsg& m = sends_.front();
    m.next_off += best->slen;
    if (m.next_off >= m.req->len) sends_.pop_front();
    if (best->shdr_done == sizeof(FrameHeader) && best->sdone == best->slen) pieceWritten(*best);
    moved |= holdLazy();
  }
  return moved;
}

// ---------------------------------------------------------------------------
// Receiving

// Read (the rest of) lane i's header; on one-lane pairs also the payload of
// the oldest posted receive, if untouched. True when bytes came (else nothing
// to read, an idle side lane's EOF, or the pair failed).
ssize_t TcpPair::laneRead(Lane& l, iovec* iov, int cnt, bool fill) {
  if (l.aheadLeft()) {
    size_t n = 0;
    for (int k = 0; k < cnt && l.aheadLeft(); ++k) {
      size_t c = std::min(iov[k].iov_len, l.ahead_len - l.ahead_off);
      std::memcpy(iov[k].iov_base, l.ahead.get() + l.ahead_off, c);
      l.ahead_off += c;
      n += c;
    }
    return static_cast<ssize_t>(n);
  }
  if (!fill) return ::readv(l.fd, iov, cnt);
  if (!l.ahead) l.ahead.reset(new char[kReadAhead]);
  iovec v[4];
  size_t want = 0;
  for (int k = 0; k < cnt; ++k) v[k] = iov[k], want += iov[k].iov_len;
  v[cnt] = {l.ahead.get(), kReadAhead};
  ssize_t r = ::readv(l.fd, v, cnt + 1);
  if (r <= static_cast<ssize_t>(want)) return r;
  l.ahead_off = 0;
  l.ahead_len = static_cast<size_t>(r) - want;
  return static_cast<ssize_t>(want);
}

bool TcpPair::readAhead() {
  if (failed_ || lanes_.empty() || !lanes_[0].aheadLeft() || lanes_[0].stalled) return false;
  return progressRecv(0);
}

bool TcpPair::readHeader(size_t i) {
  Lane& l = lanes_[i];
  iovec iov[2];
  int cnt = 0;
  iov[cnt++] = {reinterpret_cast<char*>(&l.rhdr) + l.rhdr_have, sizeof(FrameHeader) - l.rhdr_have};
  RecvSlot* front = slots_.empty() ? nullptr : &slots_.front();
  bool pre = lanes_.size() == 1 && front && front->mode == 0 && !front->complete && front->req->len > l.pre_len;
  if (pre) iov[cnt++] = {static_cast<char*>(front->req->buf) + l.pre_len, front->req->len - l.pre_len};
  ssize_t r = laneRead(l, iov, cnt, lanes_.size() == 1);
  if (r <= 0) {
    if (r == 0 && l.rhdr_have == 0 && l.pre_len == 0 && (i > 0 || peer_closed_)) {
      // A lane ended at a frame boundary: after a goodbye, or a side lane of a
      // peer that may be closing (lane 0 tells: goodbye, or EOF = died).
      l.eof = true;
      return false;
    }
    if (!ioError(r, pre ? front->req : nullptr, false)) return false;
    return false;
  }
  size_t h = std::min<size_t>(r, sizeof(FrameHeader) - l.rhdr_have);
  l.rhdr_have += h;
  if (r > static_cast<ssize_t>(h)) {
    l.pre = static_cast<char*>(front->req->buf);
    l.pre_len += r - h;
  }
  return true;
}

bool TcpPair::markPiece(RecvSlot& s, const FrameHeader& h, std::string* err) {
  if (!(h.flags & kStriped)) {
    if (s.mode != 0) return *err = "a second frame for message " + std::to_string(h.msg), false;
    s.mode = 1;
    return true;
  }
  if (s.mode == 1) return *err = "a piece of message " + std::to_string(h.msg) + " that arrived whole", false;
  s.mode = 2;
  uint64_t idx = h.offset / peer_chunk_, n = chunkCount(h.total, peer_chunk_);
  uint64_t* word = &s.seen_small;
  if (n > 64) {
    if (s.seen.empty()) s.seen.assign((n + 63) / 64, 0);
    word = &s.seen[idx / 64];
  }
  uint64_t bit = 1ull << (idx % 64);
  if (*word & bit) return *err = "piece at offset " + std::to_string(h.offset) + " of message " +
                                 std::to_string(h.msg) + " arrived twice", false;
  *word |= bit;
  return true;
}

void TcpPair::slotBytes(uint64_t msg, size_t n) {
  RecvSlot& s = slots_[msg - recv_base_];
  s.got += n;
  if (s.got == s.req->len && !s.complete) {
    s.complete = true;
    if (s.req->state == Request::kPending) s.req->complete();
  }
}

void TcpPair::popDone() {
  while (!slots_.empty() && slots_.front().complete) {
    slots_.pop_front();
    ++recv_base_;
  }
}

// Lane i's data header is complete: check it and aim its payload. False when
// the lane stalls (message not posted yet) or the pair failed.
bool TcpPair::placeFrame(size_t i) {
  Lane& l = lanes_[i];
  const FrameHeader& h = l.rhdr;
  uint64_t payload = 0;
  std::string err = checkData(h, peer_chunk_, static_cast<int>(lanes_.size()), &payload);
  if (!err.empty()) return corrupt(err), false;
  if (h.msg < l.last_msg)
    return corrupt("message number " + std::to_string(h.msg) + " after " + std::to_string(l.last_msg) +
                   " on lane " + std::to_string(i)), false;
  if (h.msg < recv_base_) return corrupt("a frame for message " + std::to_string(h.msg) + ", already complete"), false;
  if (h.msg - recv_base_ >= slots_.size()) {
    if (l.pre_len) return corrupt("frame for message " + std::to_string(h.msg) + " out of order"), false;
    l.stalled = true;  // its receive is not posted yet
    return false;
  }
  l.stalled = false;
  l.last_msg = h.msg;
  RecvSlot& s = slots_[h.msg - recv_base_];
  Request* r = s.req;
  if (h.tag != r->tag || h.total != r->len) {
    r->peer_tag = h.tag;
    r->peer_len = h.total;
    r->fail(Request::kMismatch, "message from " + who() + " does not match the posted receive");
    // The byte stream is no longer in step; nothing more can be received.
    failAll(Request::kPeerFailure, "stream from " + who() + " out of step after a collective mismatch");
    return false;
  }
  if (l.pre_len && (s.mode != 0 || &s != &slots_.front()))
    return corrupt("frame for message " + std::to_string(h.msg) + " out of order"), false;
  if (!markPiece(s, h, &err)) return corrupt(err), false;
  l.rdata = static_cast<char*>(r->buf) + h.offset;
  l.rlen = payload;
  l.rdone = 0;
  l.placed = true;
  if (r->len == 0) {
    s.complete = true;
    r->complete();
  }
  if (l.pre_len) {
    l.rdone = std::min<size_t>(l.pre_len, payload);
    l.pre_len = 0;
    slotBytes(h.msg, l.rdone);
  }
  return true;
}

// A control frame (abort notice, goodbye) on lane l; its text may have been
// read into l.pre already.
void TcpPair::control(Lane& l) {
  const FrameHeader& h = l.rhdr;
  if (&l != &lanes_[0] || (h.kind != kAbort && h.kind != kBye)) {
    uint64_t unused;
    return corrupt(checkData(h, peer_chunk_, static_cast<int>(lanes_.size()), &unused));
  }
  size_t want = std::min<uint64_t>(h.total, kMaxControlText);
  std::string text;
  if (l.pre_len) text.assign(l.pre, std::min<size_t>(l.pre_len, want));
  l.pre_len = 0;
  if (text.size() < want && l.aheadLeft()) {
    size_t c = std::min(want - text.size(), l.ahead_len - l.ahead_off);
    text.append(l.ahead.get() + l.ahead_off, c);
    l.ahead_off += c;
  }
  if (text.size() < want) {
    std::string more(want - text.size(), '\0');
    try {
      recvAll(l.fd, more.data(), more.size(), Deadline::after(2), who());
      text += more;
    } catch (const Error&) {
    }
  }
  l.rhdr_have = 0;
  if (h.kind == kBye) {  // nothing follows on lane 0; the other lanes may still hold data
    peer_closed_ = true;
    l.eof = true;
    return;
  }
  peer_gone_ = true;
  abort_text_ = who() + " aborted the communicator: " + text;
  failAll(Request::kPeerFailure, abort_text_);
}

bool TcpPair::progressRecv(size_t i) {
  Lane& l = lanes_[i];
  bool moved = false;
  while (!failed_ && !l.eof) {
    if (!l.placed) {
      if (l.rhdr_have < sizeof(FrameHeader)) {
        if (!readHeader(i)) return moved || failed_;
        moved = true;
        if (l.rhdr_have < sizeof(FrameHeader)) return moved;
      }
      if (l.rhdr.kind != kData) {
        control(l);
        return true;
      }
      if (!placeFrame(i)) return moved || failed_;
      moved = true;
    }
    if (l.rdone < l.rlen) {
      iovec v{l.rdata + l.rdone, l.rlen - l.rdone};
      ssize_t r = laneRead(l, &v, 1, lanes_.size() == 1 && v.iov_len < kReadAhead);
      if (r <= 0) {
        ioError(r, slots_[l.rhdr.msg - recv_base_].req, false);
        return moved || failed_;
      }
      moved = true;
      l.rdone += r;
      slotBytes(l.rhdr.msg, r);
      if (l.rdone < l.rlen) return moved;
    }
    l.placed = false;
    l.rhdr_have = 0;
    l.rlen = l.rdone = 0;
    popDone();
    // With no receive posted, stop after a complete frame: another read would
    // almost always find nothing (one EAGAIN readv per message, ~1 us on a VM,
    // 2-rank 8-byte allreduce 1.14x slower than before it). Lane 0's notices
    // and EOF are still read while idle: wait() polls it and readIdle() reads.
    if (slots_.empty()) return moved;
  }
  return moved;
}

void TcpPair::readIdle(size_t lane) {
  if (!failed_) progressRecv(lane);
}

bool TcpPair::progress() {
  if (failed_) return false;
  bool moved = false;
  if (!sends_.empty() || anyLaneSending() || lanes_[0].heldLeft()) moved |= progressSend();
  if (failed_) return true;
  if (slots_.empty()) return moved;
  // Only lazy receives posted (Request::lazy: deferred descriptor checks):
  // no read attempt now, which would mostly find nothing (one EAGAIN readv
  // per call at a broadcast root); wait() polls the lanes and reads them.
  bool eager = false;
  for (const RecvSlot& s : slots_)
    if (!s.complete && !s.req->lazy) {
      eager = true;
      break;
    }
  if (!eager) return moved;
  bool stuck = true, ended = false;  // no lane can bring the posted receives' bytes
  for (size_t i = 0; i < lanes_.size() && !failed_; ++i) {
    Lane& l = lanes_[i];
    if (!l.eof) moved |= progressRecv(i);
    stuck &= l.eof || l.stalled;
    ended |= l.eof;
  }
  if (!failed_ && stuck && ended && !slots_.empty()) {
    peerGone("closed the connection");
    return true;
  }
  return moved;
}

void TcpPair::sendControl(FrameKind kind, const std::string& text) {
  Lane& l = lanes_[0];
  if (l.fd < 0) return;
  // Only at a frame boundary; otherwise the peer will just see the socket close.
  if ((l.sreq && l.committed) || l.mid_frame) return;
  l.sreq = nullptr;
  FrameHeader h{static_cast<uint32_t>(kind), 0, 0, 0, text.size(), 0};
  std::string buf = l.held.substr(l.held_done);  // held lazy frames go first
  heldWritten(l);
  buf.append(reinterpret_cast<char*>(&h), sizeof h);
  buf += text;
  try {
    sendAll(l.fd, buf.data(), buf.size(), Deadline::after(1), who());
  } catch (const Error&) {
  }
}

}  // namespace harp::transport::tcp
