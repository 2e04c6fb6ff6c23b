// transport/dpdk/protocol.h — HARP's reliable message protocol over datagrams
// (PROTOCOL.md): per-peer ordered message streams cut into packets, a sliding
// window with cumulative + selective acknowledgements, retransmission on
// timeout and on SACK holes, duplicate and reorder handling, payload placed
// straight into the posted receive buffer at its byte offset.
//
// Nothing from a peer is processed before the transport has verified its
// HELLO proof (setVerified); until then only its HELLOs are handed up. Every
// DATA header is validated (wire.h dataHeaderProblem, then against the
// message's earlier packets and the posted receive) before a byte of it is
// staged or placed; a frame that fails is dropped unacknowledged, counted
// (stats().malformed) and logged (the first few). Staging for receives not yet
// posted is bounded per peer in bytes (stage_bytes, bookkeeping included) and
// in messages (stage_msgs).
//
// This layer knows nothing about DPDK: frames go out through a FrameIO (the
// DPDK glue allocates an mbuf and queues it on a port) and come in through
// onFrame(). That keeps the state machine testable and the DPDK code small.
//
// Threading: one Protocol per communicator, driven by one thread at a time
// (the transport's rule). Nothing is locked here.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/dpdk/wire.h"
#include "transport/transport.h"

namespace harp::dpdk {

// Where the protocol sends frames. begin() returns space for the HARP header
// followed by `payload` contiguous bytes (nullptr when no buffer is free right
// now: the protocol retries on the next tick); commit() queues that frame.
class FrameIO {
 public:
  virtual ~FrameIO() = default;
  virtual uint8_t* begin(int peer, size_t payload) = 0;
  virtual void commit(int peer, size_t payload) = 0;
};

// Received payload, possibly spread over chained buffer segments.
struct PayloadView {
  static constexpr int kMaxSegs = 16;
  const uint8_t* p[kMaxSegs];
  uint32_t n[kMaxSegs];
  int segs = 0;
  uint32_t total = 0;
  void copyTo(uint8_t* dst, uint32_t len) const;
};

struct ProtocolConfig {
  int window = 256;                 // packets in flight per peer (<= kSackBits)
  uint64_t rto_min_ns = 5'000'000;  // retransmission timeout bounds
  uint64_t rto_max_ns = 200'000'000;
  uint64_t peer_timeout_ns = 60'000'000'000ull;  // no ack progress for this long = peer failed
  size_t stage_bytes = 8u << 20;    // per peer: bytes buffered for receives not yet posted
  size_t stage_msgs = 1024;         // per peer: messages buffered for receives not yet posted
  int max_burst = 64;               // data packets per peer per tick
  size_t eager_bytes = 16384;       // sends up to this size (and one packet) complete when queued
};

struct ProtocolStats {
  uint64_t data_tx = 0, data_rx = 0, retx = 0, dup_rx = 0, ooo_rx = 0, acks_tx = 0, acks_rx = 0,
           staged = 0, stage_drops = 0, timeouts = 0,
           malformed = 0,  // DATA frames dropped: a header no well-formed message has (wire.h)
           unproven = 0;   // frames dropped: from a peer whose HELLO proof was not verified yet
};

class Protocol {
 public:
  Protocol(uint64_t comm_id, int rank, int size, FrameIO* io, ProtocolConfig cfg);
  ~Protocol();

  // Bytes of message payload per packet towards `peer` (from its MTU).
  void setPeer(int peer, uint32_t max_payload);
  void isend(int peer, transport::Request* r);
  void irecv(int peer, transport::Request* r);

  // One received frame (header already checked for magic/version/comm/dst;
  // everything else in it is validated here).
  void onFrame(const WireHdr& h, const PayloadView& payload);
  // The peer proved the communicator token (its HELLO): take its frames from now on.
  void setVerified(int peer) { peers_[peer].verified = true; }
  bool verified(int peer) const { return peers_[peer].verified; }
  // Timers, transmission of queued data, acknowledgements. True if anything moved.
  bool tick();
  bool hasPending() const;    // any request not finished
  bool hasUnackedSends() const;  // data queued or in flight to any peer
  bool moved() { bool m = moved_; moved_ = false; return m; }

  // Fail every request of `peer` and refuse later ones. keep_arrived (the peer
  // closed cleanly): messages it sent that wait staged for their receive stay
  // deliverable to receives posted later.
  void failPeer(int peer, const std::string& why, bool keep_arrived = false);
  bool peerFailed(int peer) const { return peers_[peer].failed; }
  // Send `type` (ABORT/BYE) frames carrying `text` to every peer (best effort).
  void broadcastControl(PktType type, const std::string& text);
  // HELLO with `body` (nonces + proof, kHelloBodyBytes) at the start of its padded payload.
  void sendHello(int peer, const std::string& body, uint8_t flags);
  // Peers whose sends are in flight and unacknowledged / recvs pending.
  bool peerBusy(int peer) const;
  uint64_t lastHeardNs(int peer) const { return peers_[peer].last_heard_ns; }
  void sendPing(int peer);

  const ProtocolStats& stats() const { return stats_; }
  static uint64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // Control frames handed up to the transport (HELLO, ABORT, BYE).
  struct Control {
    PktType type;
    int peer;
    uint8_t flags;
    uint64_t tag;
    std::string text;
  };
  std::vector<Control>& controls() { return controls_; }

 private:
  struct InFlight {
    transport::Request* req = nullptr;
    uint32_t msg_seq = 0;
    uint64_t offset = 0;
    uint32_t len = 0;
    uint64_t sent_ns = 0;
    uint16_t retx = 0;
    bool sacked = false;
    uint8_t flags = 0;
  };
  struct SendMsg {
    transport::Request* req;
    uint32_t msg_seq;
    uint64_t next_off = 0;   // next byte to packetize
    bool started = false;    // first packet sent (0-byte messages send one packet)
  };
  struct RecvSlot {
    transport::Request* req;
    uint64_t got = 0;        // payload bytes placed (or discarded after a mismatch)
    uint64_t msg_len = 0;    // the sender's tag and length, from its first packet seen
    uint64_t tag = 0;
    bool known = false;      // tag/len seen and checked
    bool done = false;       // request completed or failed (it may be freed: never touch it then)
  };
  struct Staged {            // data for a message whose receive is not posted yet
    uint64_t tag = 0, msg_len = 0;
    std::map<uint64_t, std::vector<uint8_t>> chunks;  // offset -> bytes
    size_t bytes = 0;        // charged against stage_bytes: payload + kStageOverhead per chunk and message
  };
  // Staging charged per staged message and per chunk beyond its payload (map
  // nodes, allocations), so tiny chunks cannot hold far more memory than stage_bytes.
  static constexpr size_t kStageOverhead = 128;
  // A copy of a small send's bytes, so the user's send completes at once (as a
  // kernel socket's does) instead of after the peer's acknowledgement: the
  // protocol then retransmits from the copy. `req` stands in for the user's
  // request until every packet is acknowledged; done() means reusable.
  struct EagerSend {
    transport::Request req;
    std::vector<uint8_t> bytes;
  };
  struct Peer {
    // Data queued or in flight (not yet acknowledged) towards this peer.
    bool sending() const { return snd_una != snd_nxt || !sendq.empty(); }
    uint32_t max_payload = 1400;
    std::deque<std::unique_ptr<EagerSend>> eager;       // in send order
    std::vector<std::unique_ptr<EagerSend>> eager_free;
    bool failed = false;
    std::string fail_why;
    // send side
    std::deque<SendMsg> sendq;        // messages not fully packetized
    uint32_t next_msg_seq = 0;
    uint32_t snd_una = 0, snd_nxt = 0;
    std::vector<InFlight> ring;       // indexed by seq % window
    uint64_t srtt_ns = 0, rttvar_ns = 0, rto_ns = 0;
    int backoff = 0;
    uint64_t last_progress_ns = 0;    // last time snd_una advanced (or idle)
    std::vector<transport::Request*> sends_waiting;  // packetized, awaiting acks (for failure)
    // receive side
    uint32_t rcv_nxt = 0;
    uint64_t rcv_sack[kSackBits / 64] = {0, 0, 0, 0};  // bit i: seq rcv_nxt+1+i received
    std::deque<RecvSlot> recvq;
    uint32_t recv_base = 0;           // msg_seq of recvq.front()
    std::map<uint32_t, Staged> staged;
    size_t staged_bytes = 0;
    bool ack_due = false, ack_now = false, want_retx = false;
    bool piggy_valid = false;         // a DATA frame sent since the last tick carried ...
    uint32_t piggy_nxt = 0;           // ... this cumulative ack
    uint64_t last_heard_ns = 0;
    bool verified = false;            // its HELLO proof checked out (setVerified)
  };

  WireHdr* startFrame(int peer, PktType type, uint8_t flags, size_t payload);
  bool sendData(Peer& p, int peer, uint32_t seq, InFlight& f, bool retx);
  void sendAck(Peer& p, int peer, uint8_t flags);
  void onData(Peer& p, int peer, const WireHdr& h, const PayloadView& pl);
  void onAck(Peer& p, int peer, const WireHdr& h, const PayloadView& pl);
  void advanceCumulative(Peer& p, uint32_t cum, uint64_t now);
  // false: not taken (malformed, or no room to stage it); the packet stays unacknowledged.
  bool placeData(Peer& p, int peer, const WireHdr& h, const PayloadView& pl);
  bool stage(Peer& p, int peer, const WireHdr& h, const PayloadView& pl);
  void malformed(int peer, const WireHdr& h, const char* why);
  void checkRecvHeader(Peer& p, int peer, RecvSlot& s, uint64_t tag, uint64_t len);
  void finishRecvs(Peer& p);
  void ackedEntry(Peer& p, InFlight& f, uint64_t now, bool sample_rtt);
  int retransmitDue(Peer& p, int peer, uint64_t now, uint64_t older_than_ns, int budget);
  static constexpr int kRecoveryBurst = 16;
  bool sackHas(const Peer& p, uint32_t seq) const;
  void sackSet(Peer& p, uint32_t seq);
  void sackShift(Peer& p);

  uint64_t comm_id_;
  int rank_, size_;
  FrameIO* io_;
  ProtocolConfig cfg_;
  std::vector<Peer> peers_;
  std::vector<int> active_;  // peers set up with setPeer
  ProtocolStats stats_;
  std::vector<Control> controls_;
  bool moved_ = false;
  int malformed_logged_ = 0;
};

}  // namespace harp::dpdk
