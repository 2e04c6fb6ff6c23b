// TcpStore wire protocol (all integers little-endian):
//   client hello: "HARPSTOR" + 32-byte secret; server answers 1 byte (1 = ok)
//   or, on a wrong secret, logs a warning and closes the connection.
//   request:  u8 cmd | u32 klen | key | u32 vlen | value
//   cmd 1 SET -> u8 ack;  2 GET -> u32 vlen | value (sent when the key exists);
//   cmd 3 ADD (value = 8-byte i64 delta) -> i64 new value.
#include "core/store.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "core/log.h"
#include "core/types.h"

namespace harp {
namespace {
constexpr char kHello[8] = {'H', 'A', 'R', 'P', 'S', 'T', 'O', 'R'};
enum Cmd : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };

void put32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }

bool constTimeEqual(const char* a, const char* b, size_t n) {
  unsigned char d = 0;
  for (size_t i = 0; i < n; ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

struct Client {
  int fd;
  SockAddr addr;
  bool authed = false;
  std::string in;
};
}  // namespace

TcpStoreServer::TcpStoreServer(SockAddr bind_addr, std::string secret)
    : addr_(bind_addr), secret_(std::move(secret)) {
  secret_.resize(kSecretBytes, '\0');
  listen_fd_ = listenOn(addr_);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  uint64_t one = 1;
  ssize_t w = ::write(wake_fd_, &one, 8);
  (void)w;
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void TcpStoreServer::loop() {
  std::vector<Client> clients;
  std::map<std::string, std::string> kv;
  std::multimap<std::string, int> waiters;  // key -> client fd waiting in GET

  auto reply = [](int fd, const std::string& s) {
    try {
      sendAll(fd, s.data(), s.size(), Deadline::after(10), "store client");
    } catch (const Error&) {
    }
  };
  auto valueReply = [](const std::string& v) {
    std::string s;
    put32(s, static_cast<uint32_t>(v.size()));
    return s + v;
  };

  for (;;) {
    std::vector<pollfd> pfds{{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (auto& c : clients) pfds.push_back({c.fd, POLLIN, 0});
    int pr = ::poll(pfds.data(), pfds.size(), -1);
    if (pr < 0 && errno == EINTR) continue;
    if (pfds[0].revents) break;
    if (pfds[1].revents & POLLIN) {
      Client c;
      c.addr.len = sizeof c.addr.ss;
      c.fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&c.addr.ss), &c.addr.len, SOCK_CLOEXEC);
      if (c.fd >= 0) {
        setNoDelay(c.fd);
        clients.push_back(std::move(c));
      }
    }
    std::vector<int> dead;
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      Client& c = clients[i - 2];
      char buf[65536];
      ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        dead.push_back(c.fd);
        continue;
      }
      if (r < 0) continue;
      c.in.append(buf, r);
      if (!c.authed) {
        if (c.in.size() < 8 + kSecretBytes) continue;
        if (std::memcmp(c.in.data(), kHello, 8) != 0 ||
            !constTimeEqual(c.in.data() + 8, secret_.data(), kSecretBytes)) {
          ++refused_;
          HARP_WARN("refused bootstrap connection from %s: it did not present this job's secret",
                    c.addr.str().c_str());
          dead.push_back(c.fd);
          continue;
        }
        c.authed = true;
        c.in.erase(0, 8 + kSecretBytes);
        reply(c.fd, std::string(1, '\1'));
      }
      // Parse complete requests.
      for (;;) {
        if (c.in.size() < 5) break;
        uint32_t klen, vlen;
        std::memcpy(&klen, c.in.data() + 1, 4);
        if (c.in.size() < 5 + klen + 4) break;
        std::memcpy(&vlen, c.in.data() + 5 + klen, 4);
        size_t total = 5 + klen + 4 + vlen;
        if (c.in.size() < total) break;
        uint8_t cmd = c.in[0];
        std::string key = c.in.substr(5, klen);
        std::string val = c.in.substr(9 + klen, vlen);
        c.in.erase(0, total);
        if (cmd == kSet) {
          kv[key] = val;
          reply(c.fd, std::string(1, '\1'));
          auto range = waiters.equal_range(key);
          for (auto it = range.first; it != range.second; ++it) reply(it->second, valueReply(val));
          waiters.erase(key);
        } else if (cmd == kGet) {
          auto it = kv.find(key);
          if (it != kv.end()) reply(c.fd, valueReply(it->second));
          else waiters.emplace(key, c.fd);
        } else if (cmd == kAdd) {
          int64_t delta = 0, cur = 0;
          std::memcpy(&delta, val.data(), std::min<size_t>(8, val.size()));
          auto it = kv.find(key);
          if (it != kv.end()) std::memcpy(&cur, it->second.data(), std::min<size_t>(8, it->second.size()));
          cur += delta;
          kv[key] = std::string(reinterpret_cast<char*>(&cur), 8);
          reply(c.fd, std::string(reinterpret_cast<char*>(&cur), 8));
        } else {
          dead.push_back(c.fd);
          break;
        }
      }
    }
    for (int fd : dead) {
      for (auto it = waiters.begin(); it != waiters.end();) it = it->second == fd ? waiters.erase(it) : std::next(it);
      for (size_t i = 0; i < clients.size(); ++i)
        if (clients[i].fd == fd) {
          ::close(fd);
          clients.erase(clients.begin() + i);
          break;
        }
    }
  }
  for (auto& c : clients) ::close(c.fd);
}

TcpStore::TcpStore(const SockAddr& server, std::string secret, double timeout_s) : server_(server) {
  secret.resize(kSecretBytes, '\0');
  Deadline dl = Deadline::after(timeout_s);
  fd_ = connectTo(server, dl, "the HARP bootstrap root");
  setNoDelay(fd_);
  std::string hello(kHello, 8);
  hello += secret;
  sendAll(fd_, hello.data(), hello.size(), dl, "the HARP bootstrap root at " + server.str());
  char ok = 0;
  bool got = false;
  try {
    got = recvAll(fd_, &ok, 1, dl, "the HARP bootstrap root at " + server.str());
  } catch (const Error&) {
  }
  if (!got || ok != 1) {
    ::close(fd_);
    throw Error(Error::kPeerFailure, "the HARP bootstrap root at " + server.str() +
                                         " refused this process (wrong unique id / secret, or not a HARP root)");
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::request(uint8_t cmd, const std::string& key, const std::string& value, double timeout_s) {
  std::string msg(1, static_cast<char>(cmd));
  put32(msg, static_cast<uint32_t>(key.size()));
  msg += key;
  put32(msg, static_cast<uint32_t>(value.size()));
  msg += value;
  Deadline dl = Deadline::after(timeout_s);
  std::string what = "the HARP bootstrap root at " + server_.str();
  sendAll(fd_, msg.data(), msg.size(), dl, what);
  try {
    if (cmd == kSet) {
      char ack;
      if (!recvAll(fd_, &ack, 1, dl, what)) throw Error(Error::kPeerFailure, what + " closed the connection");
      return {};
    }
    if (cmd == kAdd) {
      std::string out(8, '\0');
      if (!recvAll(fd_, out.data(), 8, dl, what)) throw Error(Error::kPeerFailure, what + " closed the connection");
      return out;
    }
    uint32_t len;
    if (!recvAll(fd_, &len, 4, dl, what)) throw Error(Error::kPeerFailure, what + " closed the connection");
    std::string out(len, '\0');
    if (len && !recvAll(fd_, out.data(), len, dl, what)) throw Error(Error::kPeerFailure, what + " closed the connection");
    return out;
  } catch (const Error& e) {
    if (e.kind() == Error::kTimeout && cmd == kGet)
      throw Error(Error::kTimeout, "timed out after " + std::to_string(static_cast<int>(timeout_s)) +
                                       " s waiting for key '" + key + "' in the HARP bootstrap store at " +
                                       server_.str() + " (did every rank start, with the same unique id and world size?)");
    throw;
  }
}

void TcpStore::set(const std::string& key, const std::string& value) { request(kSet, key, value, 60); }

std::string TcpStore::get(const std::string& key, double timeout_s) {
  std::string v = request(kGet, key, "", timeout_s);
  return v;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string v = request(kAdd, key, std::string(reinterpret_cast<char*>(&delta), 8), 60);
  int64_t out;
  std::memcpy(&out, v.data(), 8);
  return out;
}

SockAddr TcpStore::localAddress() const { return localAddrOf(fd_); }

}  // namespace harp
