#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstring>
#include <thread>

#include "base/env.h"
#include "base/types.h"

namespace harp {

Deadline Deadline::after(double seconds) {
  if (!(seconds > 0)) return Deadline{Clock::now()};
  if (seconds > kForeverS) seconds = kForeverS;
  return Deadline{Clock::now() + std::chrono::microseconds(static_cast<long long>(seconds * 1e6))};
}

std::string formatSeconds(double seconds) {
  if (!(seconds >= 0)) return "0";
  if (seconds >= kForeverS) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", seconds);
  return buf;
}

double Deadline::remainingS() const {
  return std::max(0.0, std::chrono::duration<double>(at - Clock::now()).count());
}

uint64_t timeoutNs(double seconds) {
  if (!(seconds > 0)) return 0;
  return static_cast<uint64_t>(std::min(seconds, kForeverS) * 1e9);
}

int Deadline::remainingMs() const {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now()).count();
  if (ms < 0) return 0;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

int SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SockAddr::setPort(int p) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(p);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(p);
}

std::string SockAddr::host() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  else if (family() == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  return buf;
}

std::string SockAddr::str() const {
  if (family() == AF_INET6) return "[" + host() + "]:" + std::to_string(port());
  return host() + ":" + std::to_string(port());
}

SockAddr SockAddr::parse(const std::string& s, int default_port) {
  std::string host = s, port;
  if (!s.empty() && s[0] == '[') {
    auto close = s.find(']');
    if (close == std::string::npos) throw InvalidArgument("bad address '" + s + "': missing ']'");
    host = s.substr(1, close - 1);
    if (close + 1 < s.size()) {
      if (s[close + 1] != ':') throw InvalidArgument("bad address '" + s + "'");
      port = s.substr(close + 2);
    }
  } else {
    auto colon = s.rfind(':');
    if (colon != std::string::npos && s.find(':') == colon) {
      host = s.substr(0, colon);
      port = s.substr(colon + 1);
    }
  }
  int p = default_port;
  if (!port.empty()) {
    char* end = nullptr;
    long v = std::strtol(port.c_str(), &end, 10);
    if (*end || v < 0 || v > 65535) throw InvalidArgument("bad port in address '" + s + "'");
    p = static_cast<int>(v);
  }
  if (host.empty()) throw InvalidArgument("bad address '" + s + "': empty host");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    throw InvalidArgument("cannot resolve host '" + host + "' in address '" + s + "': " + gai_strerror(rc));
  SockAddr a;
  std::memcpy(&a.ss, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  a.setPort(p);
  return a;
}

bool matchIfName(const std::string& spec_in, const std::string& name) {
  std::string spec = spec_in;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') { exclude = true; spec = spec.substr(1); }
  if (!spec.empty() && spec[0] == '=') { exact = true; spec = spec.substr(1); }
  bool hit = false;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    std::string item = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      if (exact ? name == item : name.compare(0, item.size(), item) == 0) hit = true;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return exclude ? !hit : hit;
}

std::vector<Interface> findInterfaces(const std::string& spec_arg, int family) {
  std::string spec = spec_arg.empty() ? env::str("HARP_SOCKET_IFNAME") : spec_arg;
  if (family == AF_UNSPEC) {
    std::string f = env::str("HARP_SOCKET_FAMILY");
    if (f == "AF_INET" || f == "4") family = AF_INET;
    else if (f == "AF_INET6" || f == "6") family = AF_INET6;
    else if (!f.empty()) throw InvalidArgument("HARP_SOCKET_FAMILY='" + f + "' (use AF_INET or AF_INET6)");
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw ErrnoError("getifaddrs", errno);
  std::vector<Interface> out, loop;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (family != AF_UNSPEC && fam != family) continue;
    if (!(i->ifa_flags & IFF_UP)) continue;
    if (fam == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;  // needs scope ids; skip like NCCL
    }
    Interface itf;
    itf.name = i->ifa_name;
    itf.addr.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&itf.addr.ss, i->ifa_addr, itf.addr.len);
    if (!spec.empty()) {
      if (matchIfName(spec, itf.name)) out.push_back(itf);
    } else if (i->ifa_flags & IFF_LOOPBACK) {
      loop.push_back(itf);
    } else if (!matchIfName("docker,virbr", itf.name)) {
      out.push_back(itf);
    }
  }
  freeifaddrs(list);
  if (out.empty() && spec.empty()) out = loop;
  return out;
}

int listenOn(SockAddr& addr, int backlog) {
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ErrnoError("socket", errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr.ss), addr.len) != 0) {
    int e = errno;
    ::close(fd);
    throw ErrnoError("cannot listen on " + addr.str(), e);
  }
  if (::listen(fd, backlog) != 0) {
    int e = errno;
    ::close(fd);
    throw ErrnoError("listen on " + addr.str(), e);
  }
  addr = localAddrOf(fd);
  return fd;
}

int connectTo(const SockAddr& addr, Deadline dl, const std::string& what, double refused_s) {
  int last = 0;
  int delay_ms = 1;
  Deadline refused_until;  // set at the first refusal of a run of them
  bool refusing = false;
  for (;;) {
    int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw ErrnoError("socket", errno);
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int pr = ::poll(&p, 1, std::max(1, std::min(dl.remainingMs(), 1000)));
      if (pr > 0) {
        int err = 0;
        socklen_t l = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
        rc = err ? -1 : 0;
        errno = err;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      setNonBlocking(fd, false);
      return fd;
    }
    last = errno;
    ::close(fd);
    if (refused_s >= 0 && last == ECONNREFUSED) {
      if (!refusing) refused_until = Deadline::after(refused_s);
      refusing = true;
      if (refused_until.passed())
        throw Error(Error::kPeerFailure, "could not connect to " + what + " at " + addr.str() + ": every attempt for " +
                                             formatSeconds(refused_s) + " s was refused (nothing listens there)");
    } else {
      refusing = false;
    }
    if (dl.passed()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delay_ms, std::max(1, dl.remainingMs()))));
    delay_ms = std::min(delay_ms * 2, 200);
  }
  throw Error(Error::kTimeout, "could not connect to " + what + " at " + addr.str() +
                                   " before the timeout: " + std::strerror(last));
}

int acceptOne(int listen_fd, Deadline dl, SockAddr* peer, const std::string& what) {
  for (;;) {
    pollfd p{listen_fd, POLLIN, 0};
    int pr = ::poll(&p, 1, dl.remainingMs());
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) throw ErrnoError("poll", errno);
    if (pr == 0) throw Error(Error::kTimeout, "timed out waiting for " + what);
    SockAddr a;
    a.len = sizeof a.ss;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      throw ErrnoError("accept", errno);
    }
    if (peer) *peer = a;
    return fd;
  }
}

void sendAll(int fd, const void* p, size_t n, Deadline dl, const std::string& what) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) { c += w; n -= w; continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      int pr = ::poll(&pf, 1, dl.remainingMs());
      if (pr == 0) throw Error(Error::kTimeout, "timed out sending to " + what);
      continue;
    }
    throw Error(Error::kPeerFailure, "send to " + what + " failed: " + std::strerror(errno));
  }
}

bool recvAll(int fd, void* p, size_t n, Deadline dl, const std::string& what) {
  char* c = static_cast<char*>(p);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, c + got, n - got, MSG_DONTWAIT);
    if (r > 0) { got += r; continue; }
    if (r == 0) {
      if (got == 0) return false;
      throw Error(Error::kPeerFailure, what + " closed the connection mid-message");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pf{fd, POLLIN, 0};
      int pr = ::poll(&pf, 1, dl.remainingMs());
      if (pr == 0) throw Error(Error::kTimeout, "timed out waiting for data from " + what);
      continue;
    }
    throw Error(Error::kPeerFailure, "receive from " + what + " failed: " + std::strerror(errno));
  }
  return true;
}

void setNonBlocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

SockAddr localAddrOf(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len);
  return a;
}

SockAddr peerAddrOf(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  getpeername(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len);
  return a;
}

}  // namespace harp
