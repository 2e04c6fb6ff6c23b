// transport/tcp/tcp_wire.h — the TCP transport's frame format and the checks
// a receiver applies to every frame header it reads.
//
// Wire (per pair, per lane = one TCP connection; host byte order, the peers
// share an architecture):
//
//   frame := FrameHeader (40 bytes) payload
//   FrameHeader := {u32 kind, u32 flags, u64 msg, u64 tag, u64 total, u64 offset}
//
// kind kData: one chunk of message number `msg` (per pair and direction,
// counted from 0 in posting order), which is `total` bytes long and tagged
// `tag`. Without kStriped the chunk is the whole message (offset 0, payload
// `total` bytes). With kStriped the chunk is piece offset/chunk of the
// message cut into pieces of the sender's chunk size (announced in the lane
// hello, LaneHello below): offset is a multiple of it and the payload is
// min(chunk, total - offset) bytes. A sender hands the next chunk of the
// oldest unsent message to whichever lane has room, so chunks of one
// message arrive on any lane, in any order across lanes; on each lane the
// message numbers never decrease.
//
// kind kAbort / kBye (lane 0 only, at a frame boundary): control frames;
// `total` is the length of the text that follows (abort reason; bye: 0).
//
// Every field is checked before any payload byte is placed (checkData):
// a frame that breaks these rules fails the pair with "corrupt frame from
// <peer>: <what>", never writes outside the posted buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace harp::transport::tcpwire {

enum FrameKind : uint32_t { kData = 0x48500011, kAbort = 0x48500002, kBye = 0x48500003 };
enum FrameFlags : uint32_t { kStriped = 1 };

struct FrameHeader {
  uint32_t kind;
  uint32_t flags;
  uint64_t msg;
  uint64_t tag;
  uint64_t total;
  uint64_t offset;
};
static_assert(sizeof(FrameHeader) == 40);

// Sent by both ends on lane 0 right after the authenticated handshake.
struct LaneHello {
  uint32_t magic;   // kHelloMagic
  uint32_t lanes;   // lanes this end opened to the peer
  uint64_t chunk;   // piece size of this end's striped messages
};
static_assert(sizeof(LaneHello) == 16);
constexpr uint32_t kHelloMagic = 0x314C5448;  // "HTL1"
constexpr uint64_t kMinChunk = 4096, kMaxChunk = 1ull << 30;
constexpr uint64_t kMaxControlText = 4096;  // longer abort texts are cut

// Structural check of a data frame header: "" when well formed, else what is
// wrong. On success *payload is the number of payload bytes that follow.
// peer_chunk is the chunk size the peer announced; lanes the pair's lane count
// (a one-lane pair never stripes).
std::string checkData(const FrameHeader& h, uint64_t peer_chunk, int lanes, uint64_t* payload);

// Chunks of a striped message of `total` bytes cut at `chunk`.
inline uint64_t chunkCount(uint64_t total, uint64_t chunk) { return total == 0 ? 1 : (total + chunk - 1) / chunk; }

}  // namespace harp::transport::tcpwire
