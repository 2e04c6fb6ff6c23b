// transport/dpdk/wire.h — the on-the-wire format of HARP's DPDK protocol
// (specified in PROTOCOL.md next to this file): Ethernet header, then one
// fixed 64-byte HARP header, then payload. Plain data, no DPDK types; safe
// from any thread. All multi-byte header fields are little-endian (x86 and
// arm64 hosts read them natively; a big-endian port would byte-swap here).
#pragma once

#include <cstdint>
#include <cstring>

namespace harp::dpdk {

constexpr uint16_t kEtherType = 0x88B5;  // IEEE 802 "local experimental 1"
constexpr uint16_t kMagic = 0x5048;      // "HP" read as little-endian u16
constexpr uint8_t kVersion = 1;
constexpr size_t kEthHdrLen = 14;
constexpr size_t kHdrLen = 64;
constexpr size_t kWireOverhead = kEthHdrLen + kHdrLen;
// HELLO: `tag` carries this version of the authenticated handshake; the payload
// starts with nonce (32) + the nonce heard from the peer (32) + HMAC proof (32).
constexpr uint64_t kHelloAuthVersion = 0x3248454c4c4f4832ull;  // "2HOLLEH2"
constexpr uint32_t kHelloBodyBytes = 96;
constexpr int kSackBits = 256;  // selective-ack bitmap size == max window

enum class PktType : uint8_t {
  kData = 1,      // payload bytes of one message
  kAck = 2,       // cumulative + selective acknowledgement (bitmap in payload)
  kHello = 3,     // connection handshake (tag = kHelloAuthVersion, payload: nonces + proof, flags bit kHeard)
  kAbort = 4,     // sender's communicator is broken; payload = reason text
  kBye = 5,       // sender destroyed its communicator cleanly
  kPing = 6,      // liveness probe; answered with an ACK
};

enum : uint8_t {
  kFlagFirst = 1,  // DATA: first packet of a message (offset 0)
  kFlagLast = 2,   // DATA: last packet of a message
  kFlagHeard = 4,  // HELLO: the sender has already heard a HELLO from us
  kFlagReply = 8,  // HELLO: an answer (never answered itself)
  kFlagWant = 16,  // ACK: retransmit unacknowledged data now (receiver has room again)
  kFlagAck = 32,   // DATA: `ack` carries the sender's cumulative acknowledgement (piggyback)
};

#pragma pack(push, 1)
struct WireHdr {
  uint16_t magic;
  uint8_t version;
  uint8_t type;
  uint8_t flags;
  uint8_t channel;
  uint16_t reserved0;
  uint64_t comm_id;
  uint32_t src_rank;
  uint32_t dst_rank;
  uint32_t seq;        // DATA: packet sequence number; ACK: cumulative ack (next expected)
  uint32_t msg_seq;    // DATA: message number within the flow
  uint64_t offset;     // DATA: byte offset of this payload within the message
  uint32_t payload_len;
  uint32_t ack;        // DATA with kFlagAck: cumulative ack (next expected), as an ACK's seq
  uint64_t tag;        // DATA: message tag; HELLO: auth token hash
  uint64_t msg_len;    // DATA: total message length
};
#pragma pack(pop)
static_assert(sizeof(WireHdr) == kHdrLen, "WireHdr must be 64 bytes");

// Why the header of a DATA frame cannot be part of a well-formed message
// (PROTOCOL.md section 4, "Validation"); nullptr when it can. `have` is the
// payload that arrived. Bounds are in subtraction form, so no sum can wrap.
inline const char* dataHeaderProblem(const WireHdr& h, uint32_t have) {
  if (have < h.payload_len) return "payload shorter than its payload_len";
  if (h.offset > h.msg_len) return "offset past the end of the message";
  if (h.payload_len > h.msg_len - h.offset) return "payload reaches past the end of the message";
  if (h.payload_len == 0 && h.msg_len != 0) return "empty packet in a non-empty message";
  if (((h.flags & kFlagFirst) != 0) != (h.offset == 0)) return "FIRST flag and offset 0 disagree";
  if (((h.flags & kFlagLast) != 0) != (h.payload_len == h.msg_len - h.offset))
    return "LAST flag and the end of the message disagree";
  return nullptr;
}

// Serial-number arithmetic on 32-bit sequence numbers (RFC 1982 style).
inline int32_t seqDiff(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b); }
inline bool seqLt(uint32_t a, uint32_t b) { return seqDiff(a, b) < 0; }

struct MacAddr {
  uint8_t b[6] = {0, 0, 0, 0, 0, 0};
  bool operator==(const MacAddr& o) const { return std::memcmp(b, o.b, 6) == 0; }
};

}  // namespace harp::dpdk
