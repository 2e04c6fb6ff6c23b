// transport/tcp/tcp.h — HARP's TCP transport: classes shared by its files.
//
//   tcp.cc        TcpTransport: parameters, listening, connect, progress/wait,
//                 abort, registration.
//   tcp_lane.cc   TcpPair: lanes, adaptive striping, frame reading and checks.
//   tcp_probe.cc  HARP_SOCKET_NSTREAMS=auto: the start-up lane probe.
//   tcp_wire.h    the frame format (read it first).
//
// A pair is one or more lanes (TCP connections) to one peer. Sending: a
// message below HARP_SOCKET_STRIPE_MIN (or any message on a one-lane pair)
// travels whole; a larger one is cut into HARP_SOCKET_CHUNK pieces. Each
// message or piece goes to the free lane with the shortest kernel queue, so a
// slow lane simply takes fewer (adaptive striping, not equal shares). A piece belongs to a lane once
// the kernel took its first byte. Receiving: each lane reads a header, finds
// the posted receive by message number, checks tag, length and the piece's
// place, and reads the payload straight into the posted buffer. Posting order
// matching per pair and direction is kept by the message numbers.
//
// Threading: driven by the communicator's executing thread; abort() from any.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "transport/common/handshake.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace harp::transport::tcp {

using tcpwire::FrameHeader;

// One TCP connection of a pair.
constexpr int kLazyHoldMs = 1;          // a wait() longer than this pushes the held lazy sends
constexpr size_t kLazyHoldBytes = 256;  // larger lazy sends are not held
constexpr size_t kReadAhead = 4096;     // one-lane pairs: bytes a read may take past the frame it wants

struct Lane {
  int fd = -1;
  // Send side: the piece this lane is writing (sreq == nullptr: none).
  Request* sreq = nullptr;
  FrameHeader shdr{};
  size_t shdr_done = 0;
  const char* sdata = nullptr;
  size_t slen = 0, sdone = 0;
  bool committed = false;  // the kernel took a byte of this piece
  bool mid_frame = false;  // the pair failed with a piece half written
  // Lazy sends (Request::lazy, lane 0 only): whole frames copied here and
  // completed; written after the piece in flight and before the next one, in
  // one sendmsg with it where they can.
  std::string held;
  size_t held_done = 0;    // bytes of held already written
  int held_n = 0;          // frames in held
  bool held_go = false;    // push held now (the kMaxLazyHeld-th, an unhinted send, flush(), a long wait)
  bool heldLeft() const { return held_go && held_done < held.size(); }
  // Receive side: the frame being read.
  FrameHeader rhdr{};
  size_t rhdr_have = 0;
  bool placed = false;     // rhdr checked, payload goes to rdata
  bool stalled = false;    // rhdr names a message whose receive is not posted yet
  char* rdata = nullptr;
  size_t rlen = 0, rdone = 0;
  char* pre = nullptr;     // one-lane pairs: payload read with the header into pre
  size_t pre_len = 0;
  // One-lane pairs: bytes read past the frame asked for (small frames come in
  // bursts: a peer's held lazy sends), consumed before the socket is read again.
  std::unique_ptr<char[]> ahead;
  size_t ahead_off = 0, ahead_len = 0;
  bool aheadLeft() const { return ahead_off < ahead_len; }
  uint64_t last_msg = 0;   // message numbers on a lane never decrease
  bool eof = false;        // idle lane > 0 saw EOF (the peer may be closing)
};

// A posted receive, until every byte of it arrived.
struct RecvSlot {
  Request* req = nullptr;
  uint64_t got = 0;            // payload bytes placed
  int mode = 0;                // 0: nothing yet, 1: whole-message frame, 2: striped
  bool complete = false;
  uint64_t seen_small = 0;     // pieces seen (<= 64 pieces)
  std::vector<uint64_t> seen;  // pieces seen (more)
};

// A posted send whose pieces are not all handed to lanes yet.
struct SendMsg {
  Request* req;
  uint64_t msg;
  uint64_t next_off;
  bool striped;
};

class TcpTransport;

class TcpPair : public Pair {
 public:
  TcpPair(TcpTransport* t, int peer, int lanes);
  ~TcpPair() override;
  void isend(Request* r) override;
  void irecv(Request* r) override;

  bool progress();
  void failAll(Request::Failure f, const std::string& why);
  void sendControl(tcpwire::FrameKind kind, const std::string& text);
  void readIdle(size_t lane);  // a lane polled readable while nothing was posted
  bool readAhead();            // process frames read ahead on lane 0; true if any request moved
  bool busy() const { return !sends_.empty() || !slots_.empty() || anyLaneSending() || lanes_[0].heldLeft(); }
  bool anyLaneSending() const;
  bool wantsIn(size_t lane) const;   // poll this lane for POLLIN?
  bool wantsOut(size_t lane) const;  // ... for POLLOUT?
  void dropLanes(int keep);          // after the probe: close lanes >= keep

  TcpTransport* t_;
  int peer_;
  std::vector<Lane> lanes_;
  uint64_t peer_chunk_ = 0;  // from the peer's lane hello
  std::atomic<bool> failed_{false};  // atomic: LinkStatus reads it from another thread
  std::string fail_reason_;
  // Lazy set-up (HARP_SOCKET_CONNECT=lazy): false until the lanes are
  // authenticated and the lane hellos exchanged; requests posted before wait
  // in the queues. dialed_: this rank (the higher) has started its dials.
  std::atomic<bool> up_{true};  // atomic: LinkStatus reads it from another thread
  bool dialed_ = false;
  bool hello_sent_ = false;
  std::string hello_in_;      // the peer's lane hello, as far as read
  bool peer_closed_ = false;  // peer said goodbye
  bool peer_gone_ = false;    // connection lost or peer aborted: no notice to send
  std::string abort_text_;    // the peer's abort notice, once read
  std::string who() const;

 private:
  bool progressSend();
  int writeLane(Lane& l);  // bytes written, 0 when the socket is full, -1 on failure
  bool assign(Lane& l);
  void injectFault(FrameHeader& h);
  void pieceWritten(Lane& l);
  bool holdLazy();         // copy lazy sends at the queue's front into lane 0's held bytes
  int writeHeld(Lane& l);  // push held bytes alone: as writeLane
  void heldWritten(Lane& l);
 public:
  // Mark the held bytes to go now and try to write them (under drive_mu_);
  // block: write them all (at most 1 s) unless a piece is half written.
  void pushHeld(bool block = false);
 private:
  bool progressRecv(size_t i);
  bool readHeader(size_t i);
  // readv(2) on lane l that first drains l.ahead; fill: also read up to
  // kReadAhead more bytes into it (one-lane pairs only).
  ssize_t laneRead(Lane& l, iovec* iov, int cnt, bool fill);
  bool placeFrame(size_t i);
  void control(Lane& l);
  bool markPiece(RecvSlot& s, const FrameHeader& h, std::string* err);
  void slotBytes(uint64_t msg, size_t n);
  void popDone();
  bool ioError(ssize_t r, Request* req, bool sending);
  void corrupt(const std::string& what);
  void peerGone(const std::string& how);
  void localFault(Request* r, bool sending);

  std::deque<SendMsg> sends_;
  uint64_t send_seq_ = 0;
  std::deque<RecvSlot> slots_;
  uint64_t recv_base_ = 0;   // message number of slots_.front()
  uint64_t recv_next_ = 0;   // message number the next irecv gets
};

class TcpTransport : public Transport, public LinkStatus {
 public:
  TcpTransport(const CommInfo& info, const std::vector<PeerInfo>& peers);
  ~TcpTransport() override;
  const char* name() const override { return "tcp"; }
  std::string localAddress(int) override;
  void connect(const std::vector<int>& peers, const std::vector<std::string>& remote) override;
  Pair* pair(int peer) override {
    auto it = pairs_.find(peer);
    return it == pairs_.end() ? nullptr : it->second.get();
  }
  bool progress() override;
  void wait(int timeout_ms) override;
  void flush() override;
  void abort(const std::string& why) override;
  std::string abortNotice() override;
  void* capability(const Capability& which) override {
    return &which == &LinkStatus::kCapability ? static_cast<LinkStatus*>(this) : nullptr;
  }
  // LinkStatus, any thread: pairs_ and each pair's lanes are fixed once
  // connect() returned; up_ and failed_ are atomic.
  Link link(int peer) const override {
    auto it = pairs_.find(peer);
    if (it == pairs_.end()) return {kFailed, 0};
    const TcpPair& p = *it->second;
    return {p.failed_ ? kFailed : p.up_ ? kUp : kNotYet, static_cast<int>(p.lanes_.size())};
  }

  std::string rankName(int r) const;
  bool sameHost(int peer) const;
  int lanesFor(int peer) const;  // lanes to open to `peer`
  void exchangeHello(TcpPair& p, Deadline dl);
  // The peer's lane hello against ours: "" when they agree, else why not.
  std::string checkHello(TcpPair& p, const tcpwire::LaneHello& theirs, bool* local);
  int probe(TcpPair& p, Deadline dl);  // tcp_probe.cc: lanes to keep (both ends agree)

  CommInfo info_;
  std::vector<PeerInfo> peer_info_;
  int nstreams_ = 1;       // HARP_SOCKET_NSTREAMS as a number; 0: auto
  int auto_max_ = 8;       // auto: most lanes probed
  size_t stripe_min_, chunk_, lowat_, bufsize_;
  bool bufsize_reported_ = false;
  std::string congestion_;
  std::string fault_;        // HARP_TCP_FAULT (test hook), "" normally
  bool fault_done_ = false;

 private:
  friend class TcpPair;  // isend/irecv post under drive_mu_
  void configure(int fd);
  void doAbort();
  // Lazy set-up: connect(), dials on a pair's first post (the higher rank dials,
  // as in the eager set-up), and the handshakes and lane hellos driven from
  // progress() and wait() (under drive_mu_). True from serviceConnections when a
  // pair came up or failed.
  Handshake::Config handshakeConfig(bool keep_going);
  void applyLowat(TcpPair& p);
  void connectLazy(const std::vector<int>& peers, const std::vector<std::string>& remote);
  void dialPeer(TcpPair& p);
  bool serviceConnections();
  bool readHello(TcpPair& p);
  std::unique_ptr<Handshake> lazy_hs_;             // set: lazy set-up (connectLazy)
  std::map<int, std::vector<SockAddr>> rails_of_;  // lazy: lower peers' published addresses
  std::vector<TcpPair*> hello_wait_;               // lazy: pairs whose peer's lane hello is still due
  size_t lazy_up_ = 0;                             // lazy: pairs up (for the log)
  unsigned lazy_polls_ = 0;                        // lazy: progress() calls (the listener's turn)
  int listen_fd_ = -1;
  SockAddr listen_addr_;
  std::vector<SockAddr> rails_;  // HARP_SOCKET_IFNAME with several interfaces: one address per NIC
  int wake_fd_ = -1;
  // Lazy sends (Request::lazy) wait in their lane's held bytes until an
  // unhinted send on the pair, the kMaxLazyHeld-th lazy one, flush() or a
  // wait() of over kLazyHoldMs pushes them: one sendmsg for many. Set under
  // drive_mu_; flush() reads it first.
  std::atomic<bool> any_held_{false};
  void flushLocked();
  std::map<int, std::unique_ptr<TcpPair>> pairs_;
  std::mutex abort_mu_;
  std::atomic<bool> abort_requested_{false};
  bool aborted_ = false;
  std::string abort_reason_;
  // Held by whoever touches the pairs' queues: progress(), wait(), the
  // posting of requests (TcpPair::isend/irecv) and doAbort. abort() from
  // another thread (the keep-alive) runs doAbort only when it gets the lock,
  // so it never walks a queue the collective's thread is appending to.
  std::mutex drive_mu_;
};

// Fails with a clear error when the kernel refuses TCP_CONGESTION=name.
void setCongestion(int fd, const std::string& name);

}  // namespace harp::transport::tcp
