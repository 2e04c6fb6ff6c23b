// bootstrap/socket.h — small, blocking-with-deadline socket helpers shared by the
// bootstrap store and the TCP transport, and interface selection.
//
// HARP_SOCKET_IFNAME follows NCCL_SOCKET_IFNAME's syntax: a comma-separated
// list of interface-name prefixes ("eth,ens"); "^" in front excludes instead
// ("^docker,lo"); "=" in front means exact names ("=eth0", "^=lo").
// HARP_SOCKET_FAMILY=AF_INET|AF_INET6 restricts the address family.
// All functions are thread-safe; every blocking call takes a deadline.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <vector>

namespace harp {

using Clock = std::chrono::steady_clock;
// Timeouts at or above this many seconds (~31 years, HARP_TIMEOUT=inf) mean
// "no timeout": deadlines saturate there instead of overflowing.
constexpr double kForeverS = 1e9;
struct Deadline {
  Clock::time_point at;
  // seconds <= 0 or NaN: already passed; >= kForeverS (or inf): kForeverS from now.
  static Deadline after(double seconds);
  int remainingMs() const;  // >= 0, capped at INT_MAX
  double remainingS() const;  // >= 0, uncapped (elapsed = the seconds given to after() minus this)
  bool passed() const { return Clock::now() >= at; }
};

// A duration for messages: "2.5", "300", or "inf" (>= kForeverS); never negative.
std::string formatSeconds(double seconds);
// Seconds as nanoseconds for clocks kept in uint64_t: 0 for <= 0 or NaN,
// saturated at kForeverS (so now + timeoutNs(t) never wraps).
uint64_t timeoutNs(double seconds);

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;

  int family() const { return ss.ss_family; }
  int port() const;
  void setPort(int port);
  std::string str() const;  // "1.2.3.4:5" or "[::1]:5"
  std::string host() const;
  // "host:port", "[v6]:port", or "host" (port = default_port). Resolves names.
  static SockAddr parse(const std::string& s, int default_port = 0);
};

struct Interface {
  std::string name;
  SockAddr addr;
};

// Interfaces with an address, filtered by HARP_SOCKET_IFNAME / HARP_SOCKET_FAMILY
// (or by `spec` when given). Loopback is kept only if nothing else matches, or if
// the spec selects it.
std::vector<Interface> findInterfaces(const std::string& spec, int family = AF_UNSPEC);
bool matchIfName(const std::string& spec, const std::string& name);

// Listening socket on `addr` (port 0 = any free); on return addr holds the port.
int listenOn(SockAddr& addr, int backlog = 128);
// Connect, retrying refused/unreachable until the deadline. Throws a harp::Error
// naming `what` and the address on failure. refused_s >= 0: also give up
// (kPeerFailure, text "nothing listens there") once every attempt for that
// many seconds was refused — for a server known to have listened already.
int connectTo(const SockAddr& addr, Deadline dl, const std::string& what, double refused_s = -1);
// Accept one connection before the deadline (throws kTimeout). `peer` filled.
int acceptOne(int listen_fd, Deadline dl, SockAddr* peer, const std::string& what);

void sendAll(int fd, const void* p, size_t n, Deadline dl, const std::string& what);
// Returns false on orderly EOF before any byte; throws on errors/timeout/partial.
bool recvAll(int fd, void* p, size_t n, Deadline dl, const std::string& what);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
SockAddr localAddrOf(int fd);
SockAddr peerAddrOf(int fd);

}  // namespace harp
