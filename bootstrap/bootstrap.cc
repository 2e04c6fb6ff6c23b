#include "bootstrap/bootstrap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "base/env.h"
#include "base/log.h"
#include "bootstrap/rendezvous.h"
#include "base/types.h"

namespace harp {
namespace {
constexpr char kMagic[8] = {'H', 'A', 'R', 'P', 'U', 'I', 'D', '1'};
}

std::string randomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw ErrnoError("getrandom", errno);
    }
    got += r;
  }
  return out;
}

uint64_t hash64(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

UniqueId UniqueId::make(const SockAddr& addr, const std::string& secret) {
  UniqueId id;
  auto* b = id.bytes.data();
  std::memcpy(b, kMagic, 8);
  uint16_t fam = static_cast<uint16_t>(addr.family()), port = static_cast<uint16_t>(addr.port());
  std::memcpy(b + 8, &fam, 2);
  std::memcpy(b + 10, &port, 2);
  if (addr.family() == AF_INET)
    std::memcpy(b + 12, &reinterpret_cast<const sockaddr_in*>(&addr.ss)->sin_addr, 4);
  else
    std::memcpy(b + 12, &reinterpret_cast<const sockaddr_in6*>(&addr.ss)->sin6_addr, 16);
  std::string s = secret;
  s.resize(kSecretBytes, '\0');
  std::memcpy(b + 28, s.data(), kSecretBytes);
  return id;
}

SockAddr UniqueId::address() const {
  const auto* b = bytes.data();
  if (std::memcmp(b, kMagic, 8) != 0)
    throw InvalidArgument("not a HARP unique id (bad magic): create it with harp.get_unique_id()");
  uint16_t fam, port;
  std::memcpy(&fam, b + 8, 2);
  std::memcpy(&port, b + 10, 2);
  SockAddr a;
  if (fam == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, b + 12, 4);
    a.len = sizeof(sockaddr_in);
  } else if (fam == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, b + 12, 16);
    a.len = sizeof(sockaddr_in6);
  } else {
    throw InvalidArgument("HARP unique id holds an unknown address family " + std::to_string(fam));
  }
  a.setPort(port);
  return a;
}

std::string UniqueId::secret() const {
  return std::string(reinterpret_cast<const char*>(bytes.data()) + 28, kSecretBytes);
}

std::string UniqueId::hex() const {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

UniqueId UniqueId::fromHex(const std::string& h) {
  if (h.size() != 256) throw InvalidArgument("a HARP unique id in hex has 256 characters, got " + std::to_string(h.size()));
  UniqueId id;
  auto val = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw InvalidArgument("a HARP unique id in hex has a non-hex character");
  };
  for (size_t i = 0; i < 128; ++i) id.bytes[i] = static_cast<unsigned char>(val(h[2 * i]) * 16 + val(h[2 * i + 1]));
  id.address();  // validates
  return id;
}

UniqueId UniqueId::fromBytes(const void* p, size_t n) {
  if (n != 128) throw InvalidArgument("a HARP unique id has 128 bytes, got " + std::to_string(n));
  UniqueId id;
  std::memcpy(id.bytes.data(), p, 128);
  id.address();
  return id;
}

namespace {
// Store servers this process runs, by address + secret. A server's thread
// ends by itself once its communicator formed and every client left
// (TcpStoreServer); finished ones are freed here on the next call. Entries
// inherited through fork() belong to the parent (their thread does not exist
// here) and are never joined: they are dropped without running the destructor.
struct ServerEntry {
  std::unique_ptr<TcpStoreServer> server;
  pid_t pid;
};
std::mutex g_servers_mu;
std::map<std::string, ServerEntry>& servers() {
  static auto* m = new std::map<std::string, ServerEntry>();  // lives until exit
  return *m;
}
void reapLocked(bool everything_of, const std::string& only_key) {
  pid_t me = getpid();
  for (auto it = servers().begin(); it != servers().end();) {
    bool target = it->second.server->finished() || (everything_of && it->first == only_key);
    if (it->second.pid != me) {
      (void)it->second.server.release();  // the parent's; not ours to join
      it = servers().erase(it);
    } else if (target) {
      it = servers().erase(it);
    } else {
      ++it;
    }
  }
}
std::string serverKey(const SockAddr& a, const std::string& secret) {
  std::string s = secret;
  s.resize(kSecretBytes, '\0');
  return a.str() + "|" + s;
}
}  // namespace

UniqueId createUniqueId(const std::string& bind) {
  SockAddr addr;
  if (!bind.empty()) {
    addr = SockAddr::parse(bind, 0);
  } else if (env::has("HARP_SOCKET_IFNAME") || env::has("HARP_SOCKET_FAMILY")) {
    auto itfs = findInterfaces("");
    if (itfs.empty())
      throw InvalidArgument("no network interface matches HARP_SOCKET_IFNAME='" + env::str("HARP_SOCKET_IFNAME") +
                            "' / HARP_SOCKET_FAMILY='" + env::str("HARP_SOCKET_FAMILY") + "'");
    addr = itfs[0].addr;
  } else {
    auto itfs = findInterfaces("");
    addr = itfs.empty() ? SockAddr::parse("127.0.0.1", 0) : itfs[0].addr;
  }
  addr.setPort(addr.port());
  std::string secret = randomBytes(kSecretBytes);
  auto server = std::make_unique<TcpStoreServer>(addr, secret);
  UniqueId id = UniqueId::make(server->address(), secret);
  id.bytes[UniqueId::kListeningByte] = 1;  // a refusing store has retired
  std::lock_guard<std::mutex> g(g_servers_mu);
  reapLocked(false, "");
  std::string key = serverKey(server->address(), secret);  // before the move below
  servers()[key] = ServerEntry{std::move(server), getpid()};
  HARP_INFO("bootstrap root listening on %s", id.address().str().c_str());
  return id;
}

void ensureStoreServer(const SockAddr& addr, const std::string& secret) {
  std::lock_guard<std::mutex> g(g_servers_mu);
  reapLocked(false, "");
  std::string key = serverKey(addr, secret);
  if (servers().count(key)) return;
  servers()[key] = ServerEntry{std::make_unique<TcpStoreServer>(addr, secret), getpid()};
}

bool dropUniqueId(const UniqueId& id) {
  std::lock_guard<std::mutex> g(g_servers_mu);
  reapLocked(false, "");
  auto it = servers().find(serverKey(id.address(), id.secret()));
  if (it == servers().end() || it->second.pid != getpid()) return false;
  if (it->second.server->retireWhenIdle()) servers().erase(it);  // idle: gone now (joined)
  return true;
}

bool releaseStoreServer(const UniqueId& id) {
  std::lock_guard<std::mutex> g(g_servers_mu);
  std::string key = serverKey(id.address(), id.secret());
  bool had = servers().count(key) && servers()[key].pid == getpid();
  reapLocked(true, key);
  return had;
}

int storeServersRunning() {
  std::lock_guard<std::mutex> g(g_servers_mu);
  reapLocked(false, "");
  int n = 0;
  for (auto& [k, e] : servers()) n += e.pid == getpid() && !e.server->finished();
  return n;
}

namespace {
std::string nsInode(const char* ns) {
  struct stat st{};
  std::string path = std::string("/proc/self/ns/") + ns;
  return stat(path.c_str(), &st) == 0 ? std::string(ns) + std::to_string(st.st_ino) : std::string(ns) + "?";
}
// The filesystem behind /dev/shm (its device number), not the mount namespace:
// `ip netns exec` gives every process its own mount namespace over the same
// /dev/shm, while a container or an arena host mounts a tmpfs of its own there.
std::string shmIdentity() {
  struct stat st{};
  return stat("/dev/shm", &st) == 0 ? "shm" + std::to_string(static_cast<unsigned long long>(st.st_dev)) : "shm?";
}
}  // namespace

HostIdentity thisHost() {
  HostIdentity h;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(f, boot);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  h.hostname = host;
  if (env::has("HARP_HOSTID")) {
    h.host_id = "hostid:" + env::str("HARP_HOSTID");
  } else {
    h.host_id = (boot.empty() ? h.hostname : boot) + "/" + nsInode("net") + nsInode("ipc") + shmIdentity();
  }
  h.pid = static_cast<int>(getpid());
  return h;
}

namespace {
// The probe object: /dev/shm/<name>, 32 bytes of nonce. Owner side.
std::string createProbe(std::string* nonce) {
  *nonce = randomBytes(32);
  static const char* d = "0123456789abcdef";
  std::string name = "/harp-probe-";
  for (unsigned char c : randomBytes(8)) name += d[c >> 4], name += d[c & 15];
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw ErrnoError("shm_open(" + name + ") for the host probe", errno);
  ssize_t w = write(fd, nonce->data(), nonce->size());
  int err = errno;
  close(fd);
  if (w != static_cast<ssize_t>(nonce->size())) {
    shm_unlink(name.c_str());
    throw ErrnoError("writing the host probe " + name, w < 0 ? err : EIO);
  }
  return name;
}

// Reader side: "" when the object holds `nonce`, else why not.
std::string readProbe(const std::string& name, const std::string& nonce) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) return "bad probe name";
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return std::string("cannot open ") + name + ": " + std::strerror(errno);
  char buf[32];
  ssize_t r = read(fd, buf, sizeof buf);
  close(fd);
  if (r != 32 || nonce.size() != 32 || std::memcmp(buf, nonce.data(), 32) != 0) return name + " holds other bytes";
  return "";
}
}  // namespace

std::vector<std::string> confirmHostIds(Store& store, const std::string& prefix, int rank,
                                        const std::vector<std::string>& claimed, double timeout_s) {
  const int size = static_cast<int>(claimed.size());
  int lowest = rank, members = 0;
  for (int r = 0; r < size; ++r)
    if (claimed[r] == claimed[rank]) lowest = std::min(lowest, r), ++members;
  std::string mine = claimed[rank], probe_name;
  if (members > 1 && lowest == rank) {
    std::string nonce, rec = "|";  // "|": no probe (the others then count as other hosts)
    try {
      probe_name = createProbe(&nonce);
      rec = probe_name + "|" + nonce;
    } catch (const Error& e) {
      HARP_WARN("rank %d cannot create the host probe (%s): ranks claiming host '%s' count as separate hosts", rank,
                e.what(), claimed[rank].c_str());
    }
    store.set(prefix + "probe/" + std::to_string(rank), rec);
  } else if (members > 1) {
    std::string v = rendezvousGet(store, prefix + "probe/" + std::to_string(lowest), timeout_s);
    size_t bar = v.find('|');
    std::string why = bar == std::string::npos ? "malformed probe record"
                                                : readProbe(v.substr(0, bar), v.substr(bar + 1));
    if (!why.empty()) {
      HARP_WARN("rank %d claims host '%s' with rank %d but its shared-memory probe fails (%s): treated as another host",
                rank, claimed[rank].c_str(), lowest, why.c_str());
      mine += "/probe-failed/r" + std::to_string(rank);
    }
  }
  std::vector<std::string> out;
  try {
    out = storeAllgather(store, prefix + "hostok", rank, size, mine, timeout_s);
  } catch (...) {
    if (!probe_name.empty()) shm_unlink(probe_name.c_str());
    throw;
  }
  if (!probe_name.empty()) shm_unlink(probe_name.c_str());
  return out;
}

std::string packBlobs(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) {
    uint32_t n = static_cast<uint32_t>(s.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += s;
  }
  return out;
}

std::vector<std::string> unpackBlobs(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i < s.size()) {
    uint32_t n;
    if (s.size() - i < 4) throw Error(Error::kInternal, "corrupt bootstrap record (a cut length)");
    std::memcpy(&n, s.data() + i, 4);
    i += 4;
    if (n > s.size() - i) throw Error(Error::kInternal, "corrupt bootstrap record (a length past its end)");
    v.push_back(s.substr(i, n));
    i += n;
  }
  return v;
}

std::vector<std::string> storeAllgather(Store& store, const std::string& key, int rank, int size,
                                        const std::string& mine, double timeout_s) {
  std::vector<std::string> all(size);
  if (size < env::integer("HARP_STORE_GATHER_RANKS")) {
    store.set(key + "/" + std::to_string(rank), mine);
    for (int r = 0; r < size; ++r)
      all[r] = r == rank ? mine : rendezvousGet(store, key + "/" + std::to_string(r), timeout_s);
    return all;
  }
  // Many ranks: p requests per rank make p^2 at the one store; instead rank 0
  // collects every blob and publishes them as one record (3p - 2 requests in
  // all). A rank rank 0 waits for in vain is named to every rank through the
  // rendezvous error key.
  if (rank != 0) {
    store.set(key + "/" + std::to_string(rank), mine);
    std::vector<std::string> got = unpackBlobs(rendezvousGet(store, key + "/all", timeout_s));
    if (got.size() != static_cast<size_t>(size))
      throw Error(Error::kInternal, "corrupt bootstrap record '" + key + "/all': " + std::to_string(got.size()) +
                                        " blobs for " + std::to_string(size) + " ranks");
    return got;
  }
  all[0] = mine;
  for (int r = 1; r < size; ++r) {
    try {
      all[r] = rendezvousGet(store, key + "/" + std::to_string(r), timeout_s);
    } catch (const Error& e) {
      postRendezvousError(store, e.kind(), "rank 0 gathering '" + key + "' for " + std::to_string(size) +
                                               " ranks: no record from rank " + std::to_string(r) + ": " + e.what());
      throw;
    }
  }
  store.set(key + "/all", packBlobs(all));
  return all;
}

}  // namespace harp
