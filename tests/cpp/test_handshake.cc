// transport/common/handshake: a dial that fails in the same round in which another
// dial finished must leave nothing for ~Handshake to free or close twice
// (regression: a rank killed while lazily made sub-communicators connected
// crashed rank 0 with glibc's "double free or corruption" and, through a stray
// close of a reused fd number, stopped its bootstrap store).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "bootstrap/socket.h"
#include "base/types.h"
#include "transport/common/handshake.h"

using namespace harp;
using harp::transport::Handshake;

namespace {
Handshake::Config config(int rank, std::function<std::string(int)> vet = nullptr) {
  Handshake::Config c;
  c.transport = "tcp";
  c.key = "0123456789abcdef";
  c.comm_id = 0x1234;
  c.rank = rank;
  c.vet = std::move(vet);
  return c;
}
}  // namespace

TEST(Handshake, ADialFailingInTheRoundAnotherFinishedFreesNothingTwice) {
  // Peer 0: an honest acceptor. Peer 1: an impostor that answers any hello
  // with 64 bytes of garbage (sent at once, before the hello).
  SockAddr a = SockAddr::parse("127.0.0.1", 0), b = SockAddr::parse("127.0.0.1", 0);
  int la = listenOn(a), lb = listenOn(b);
  std::thread honest([la] {
    Handshake hs(config(0));
    hs.expect(2, 0);
    try {
      hs.run(la, Deadline::after(20));
      ::close(hs.take(2, 0));
    } catch (const Error&) {
    }
  });
  std::thread impostor([lb] {
    SockAddr peer;
    int fd = acceptOne(lb, Deadline::after(20), &peer, "test client");
    std::string junk(Handshake::kChallengeBytes, 'x');
    ssize_t w = ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    (void)w;
    char buf[256];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
    ::close(fd);
  });
  // Both connects complete before run(); the vet of the second dial (in the
  // same round as the first's hello) waits until the honest challenge is
  // there too, so the next round finishes dial 0 and then throws for dial 1.
  std::atomic<int> vetted{0};
  {
    Handshake hs(config(2, [&](int) {
      if (vetted++ == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return std::string();
    }));
    hs.dial(0, 0, a.ss, a.len, a.str());
    hs.dial(1, 0, b.ss, b.len, b.str());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    try {
      hs.run(-1, Deadline::after(20));
      ADD_FAILURE() << "an impostor's challenge was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("did not prove"), std::string::npos) << e.what();
    }
    int done = hs.take(0, 0);  // the finished dial's socket is still ours
    EXPECT_GE(::fcntl(done, F_GETFD), 0);
    ::close(done);
  }  // ~Handshake: before the fix, freed dial 0 a second time (glibc aborts) and closed a stale fd
  honest.join();
  impostor.join();
  ::close(la);
  ::close(lb);
  EXPECT_EQ(vetted.load(), 2);
}
