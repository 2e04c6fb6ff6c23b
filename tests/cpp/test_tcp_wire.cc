// tests/cpp/test_tcp_wire.cc — the TCP frame header checks (transport/tcp/tcp_wire.h):
// every malformed field is refused with a message naming it, and the payload
// length of a well-formed frame never reaches past its message.
#include <gtest/gtest.h>

#include "transport/tcp/tcp_wire.h"

using namespace harp::transport::tcpwire;

namespace {
FrameHeader data(uint32_t flags, uint64_t total, uint64_t offset) { return {kData, flags, 3, 77, total, offset}; }
}  // namespace

TEST(TcpWire, WholeMessageFrame) {
  uint64_t n = 0;
  EXPECT_EQ(checkData(data(0, 1000, 0), 4096, 1, &n), "");
  EXPECT_EQ(n, 1000u);
  EXPECT_EQ(checkData(data(0, 0, 0), 4096, 4, &n), "");
  EXPECT_EQ(n, 0u);
  EXPECT_NE(checkData(data(0, 1000, 8), 4096, 1, &n).find("offset 8"), std::string::npos);
}

TEST(TcpWire, StripedPieces) {
  uint64_t n = 0;
  EXPECT_EQ(checkData(data(kStriped, 10000, 0), 4096, 2, &n), "");
  EXPECT_EQ(n, 4096u);
  EXPECT_EQ(checkData(data(kStriped, 10000, 8192), 4096, 2, &n), "");
  EXPECT_EQ(n, 10000u - 8192u);  // the last piece is short
  EXPECT_EQ(chunkCount(10000, 4096), 3u);
  EXPECT_EQ(chunkCount(0, 4096), 1u);
}

TEST(TcpWire, RefusesMalformedHeaders) {
  uint64_t n = 0;
  EXPECT_NE(checkData(data(kStriped, 10000, 12288), 4096, 2, &n).find("beyond message length"), std::string::npos);
  EXPECT_NE(checkData(data(kStriped, 10000, 10000), 4096, 2, &n).find("beyond"), std::string::npos);
  EXPECT_NE(checkData(data(kStriped, 10000, 4097), 4096, 2, &n).find("not a multiple"), std::string::npos);
  EXPECT_NE(checkData(data(kStriped, 10000, 0), 4096, 1, &n).find("one-lane"), std::string::npos);
  EXPECT_NE(checkData(data(kStriped, 10000, 0), 0, 2, &n).find("chunk size"), std::string::npos);
  EXPECT_NE(checkData(data(kStriped | 8, 10000, 0), 4096, 2, &n).find("flags"), std::string::npos);
  FrameHeader bad = data(0, 10, 0);
  bad.kind = 0x12345678;
  EXPECT_NE(checkData(bad, 4096, 2, &n).find("kind"), std::string::npos);
  // Overflow-prone values: offset + payload never wraps past total.
  uint64_t big = ~0ull;
  EXPECT_EQ(checkData(data(kStriped, big, big - (big % 4096)), 4096, 2, &n), "");
  EXPECT_LE(n, 4096u);
  EXPECT_NE(checkData(data(kStriped, 4096, big - (big % 4096)), 4096, 2, &n), "");
}
