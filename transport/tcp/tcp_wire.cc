// transport/tcp/tcp_wire.cc — header checks for the TCP frame format
// (tcp_wire.h). Pure functions: no sockets, no state; unit-tested in
// tests/cpp/test_tcp_wire.cc.
#include "transport/tcp/tcp_wire.h"

namespace harp::transport::tcpwire {

std::string checkData(const FrameHeader& h, uint64_t peer_chunk, int lanes, uint64_t* payload) {
  if (h.kind != kData) return "bad frame kind " + std::to_string(h.kind);
  if (h.flags & ~static_cast<uint32_t>(kStriped)) return "unknown frame flags " + std::to_string(h.flags);
  if (!(h.flags & kStriped)) {
    if (h.offset != 0) return "whole-message frame with offset " + std::to_string(h.offset);
    *payload = h.total;
    return "";
  }
  if (lanes < 2) return "striped frame on a one-lane connection";
  if (peer_chunk < kMinChunk || peer_chunk > kMaxChunk) return "striped frame without a valid chunk size";
  if (h.offset >= h.total) return "chunk offset " + std::to_string(h.offset) + " beyond message length " +
                                  std::to_string(h.total);
  if (h.offset % peer_chunk) return "chunk offset " + std::to_string(h.offset) + " not a multiple of the chunk size " +
                                    std::to_string(peer_chunk);
  uint64_t rest = h.total - h.offset;
  *payload = rest < peer_chunk ? rest : peer_chunk;
  return "";
}

}  // namespace harp::transport::tcpwire
