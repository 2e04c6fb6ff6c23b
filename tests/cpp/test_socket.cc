// Address parsing, NCCL-style interface matching, unique ids, and the store's
// secret check.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "bootstrap/store.h"
#include "base/types.h"

using namespace harp;

TEST(SockAddr, ParsesV4V6AndPorts) {
  auto a = SockAddr::parse("127.0.0.1:5555");
  EXPECT_EQ(a.family(), AF_INET);
  EXPECT_EQ(a.port(), 5555);
  EXPECT_EQ(a.str(), "127.0.0.1:5555");
  auto b = SockAddr::parse("[::1]:80");
  EXPECT_EQ(b.family(), AF_INET6);
  EXPECT_EQ(b.str(), "[::1]:80");
  auto c = SockAddr::parse("::1", 7);
  EXPECT_EQ(c.port(), 7);
  EXPECT_THROW(SockAddr::parse("127.0.0.1:99999"), Error);
  EXPECT_THROW(SockAddr::parse("no.such.host.invalid:1"), Error);
}

TEST(IfName, FollowsNcclSyntax) {
  EXPECT_TRUE(matchIfName("eth", "eth0"));
  EXPECT_TRUE(matchIfName("ib,eth", "eth1"));
  EXPECT_FALSE(matchIfName("ib", "eth0"));
  EXPECT_FALSE(matchIfName("^eth", "eth0"));
  EXPECT_TRUE(matchIfName("^docker,lo", "eth0"));
  EXPECT_TRUE(matchIfName("=eth0", "eth0"));
  EXPECT_FALSE(matchIfName("=eth0", "eth01"));
  EXPECT_FALSE(matchIfName("^=eth0", "eth0"));
  EXPECT_TRUE(matchIfName("^=eth0", "eth01"));
}

TEST(UniqueId, HexRoundTripAndValidation) {
  auto id = UniqueId::make(SockAddr::parse("[::1]:1234"), std::string(32, 'k'));
  auto back = UniqueId::fromHex(id.hex());
  EXPECT_EQ(back.address().str(), "[::1]:1234");
  EXPECT_EQ(back.secret(), std::string(32, 'k'));
  EXPECT_THROW(UniqueId::fromHex("abcd"), Error);
  std::string junk(128, 'x');
  EXPECT_THROW(UniqueId::fromBytes(junk.data(), junk.size()), Error);
}

TEST(Store, SetGetAddAndWrongSecretRefused) {
  std::string secret = randomBytes(32);
  TcpStoreServer server(SockAddr::parse("127.0.0.1:0"), secret);
  TcpStore a(server.address(), secret, 5), b(server.address(), secret, 5);
  a.set("k", "v1");
  EXPECT_EQ(b.get("k", 5), "v1");
  EXPECT_EQ(a.add("n", 3), 3);
  EXPECT_EQ(b.add("n", 4), 7);
  EXPECT_THROW(b.get("missing", 0.3), Error);
  try {
    TcpStore bad(server.address(), randomBytes(32), 5);
    FAIL() << "wrong secret accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::kPeerFailure);
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos);
  }
  // The root counts the refusal when it sees the hang-up, asynchronously.
  for (int i = 0; i < 500 && server.refusedConnections() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server.refusedConnections(), 1);
}
