// core/engine/connect.cc — how a communicator connects at creation
// (Communicator::connectAll): identity, usable transports, where every rank is,
// which transport serves each peer, and the connections.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/log.h"
#include "base/reduce.h"
#include "bootstrap/crypto.h"
#include "bootstrap/rendezvous.h"
#include "core/engine/communicator.h"

namespace harp {
namespace {

// The per-peer transport addresses: runs of equal blobs as (count, blob), so a
// rank whose peers all get the same address (tcp) publishes it once, not p - 1 times.
std::string packRuns(const std::vector<std::string>& v) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j < v.size() && v[j] == v[i]) ++j;
    uint32_t n = static_cast<uint32_t>(j - i);
    runs.push_back(std::string(reinterpret_cast<const char*>(&n), 4) + v[i]);
    i = j;
  }
  return packBlobs(runs);
}

std::vector<std::string> unpackRuns(const std::string& s, size_t want) {
  std::vector<std::string> v;
  for (const std::string& run : unpackBlobs(s)) {
    uint32_t n;
    if (run.size() < 4) throw Error(Error::kInternal, "corrupt bootstrap address record");
    std::memcpy(&n, run.data(), 4);
    if (n > want - v.size()) throw Error(Error::kInternal, "corrupt bootstrap address record (too many peers)");
    v.insert(v.end(), n, run.substr(4));
  }
  if (v.size() != want) throw Error(Error::kInternal, "corrupt bootstrap address record (too few peers)");
  return v;
}

// Find the TcpStore under any PrefixStores, for the interface hint.
TcpStore* tcpStoreOf(Store* s) {
  while (s) {
    if (auto* t = dynamic_cast<TcpStore*>(s)) return t;
    auto* p = dynamic_cast<PrefixStore*>(s);
    s = p ? p->base().get() : nullptr;
  }
  return nullptr;
}

}  // namespace

// Which transports this rank may use (highest priority first) and, once the
// ranks have told each other where they are, which peers each one serves.
struct Communicator::Plan {
  std::string forced;  // CommOptions::transport or HARP_TRANSPORT ("": automatic)
  std::vector<const transport::TransportSpec*> usable;
  std::vector<std::vector<int>> peers_of;  // per usable transport: the peers it serves
};

namespace {

std::string forcedTransport(const CommOptions& o) {
  std::string forced = !o.transport.empty() ? o.transport : env::str("HARP_TRANSPORT");
  return forced == "auto" ? "" : forced;
}

// The transports that can run in this process (only `forced`, when given), by
// priority. A forced transport that is unavailable or unknown is an error.
std::vector<const transport::TransportSpec*> usableTransports(const std::string& forced) {
  std::vector<const transport::TransportSpec*> usable;
  for (const auto& spec : transport::registeredTransports()) {
    if (!forced.empty() && spec.name != forced) continue;
    std::string why = spec.unavailable ? spec.unavailable() : "";
    if (!why.empty()) {
      if (!forced.empty()) throw Error(Error::kUnavailable, "HARP_TRANSPORT=" + forced + ": " + why);
      HARP_INFO_S(LogSubsys::kInit, "transport %s unavailable: %s", spec.name.c_str(), why.c_str());
      continue;
    }
    usable.push_back(&spec);
  }
  if (!forced.empty() && usable.empty()) {
    std::string known;
    for (const auto& s : transport::registeredTransports()) known += (known.empty() ? "" : ", ") + s.name;
    throw InvalidArgument("unknown transport '" + forced + "' (known: " + known + ")");
  }
  std::sort(usable.begin(), usable.end(), [](auto* a, auto* b) { return a->priority > b->priority; });
  return usable;
}

// The tuning key: the one transport every peer uses, "mixed", or "self".
std::string transportKind(const std::vector<transport::Transport*>& transport_of) {
  std::string kind;
  for (auto* t : transport_of) {
    if (!t) continue;
    if (kind.empty()) kind = t->name();
    else if (kind != t->name()) kind = "mixed";
  }
  return kind.empty() ? "self" : kind;
}

}  // namespace

// Creation in five steps: identity, usable transports, where every rank is
// (round 1 through the store), which transport serves each peer, and the
// connections (round 2: addresses through the store, then connect).
void Communicator::connectAll() {
  setLogRank(rank_);
  drawIdentity();
  Plan plan;
  plan.forced = forcedTransport(opts_);
  plan.usable = usableTransports(plan.forced);
  const auto avail = exchangeHostInfo(plan);
  adaptSpin();
  assignPeers(plan, avail);
  connectTransports(plan, commInfo());
  startKeepAlive();  // fault tolerance: core/engine/communicator_ft.cc
  transport_kind_ = transportKind(res_.transport_of);
  HARP_INFO_S(LogSubsys::kInit, "comm %016llx ready: rank %d of %d, reduction kernels %s", (unsigned long long)comm_id_, rank_, size_,
            reduceKernelName());
}

// Rank 0 draws the communicator id and connection token; everyone reads them.
void Communicator::drawIdentity() {
  if (rank_ == 0) store_->set("token", randomBytes(24));
  std::string tok = rendezvousGet(*store_, "token", timeout_s_);
  if (tok.size() != 24) throw Error(Error::kInternal, "corrupt rendezvous token (" + std::to_string(tok.size()) + " bytes)");
  token_ = tok.substr(0, 16);
  std::memcpy(&comm_id_, tok.data() + 16, 8);
}

// Round 1: who is where (fills peers_), and which transports each rank can
// run (returned, by rank).
std::vector<std::vector<std::string>> Communicator::exchangeHostInfo(const Plan& plan) {
  HostIdentity me = thisHost();
  std::vector<std::string> mine{me.host_id, me.hostname, std::to_string(me.pid), localNics()};
  for (auto* s : plan.usable) mine.push_back(s->name);
  auto all = storeAllgather(*store_, "info", rank_, size_, packBlobs(mine), timeout_s_);
  peers_.resize(size_);
  std::vector<std::vector<std::string>> avail(size_);
  std::vector<std::string> nics(size_);
  for (int r = 0; r < size_; ++r) {
    auto v = unpackBlobs(all[r]);
    if (v.size() < 4) throw Error(Error::kInternal, "corrupt bootstrap record of rank " + std::to_string(r));
    peers_[r].rank = r;
    peers_[r].host_id = v.at(0);
    peers_[r].hostname = v.at(1);
    peers_[r].pid = std::stoi(v.at(2));
    nics[r] = v.at(3);
    avail[r].assign(v.begin() + 4, v.end());
  }
  confirmHosts(nics);  // Topology: probe the claimed host keys, build topo_
  return avail;
}

// Ranks sharing a machine's CPUs with more ranks than it has cores must not
// spin long while waiting: the peer they wait for needs the core (measured on 2
// cores, 4 ranks, 8-byte allreduce over TCP: 64 polls ~150 us, 16 polls ~85 us;
// later, quiet, 2000 calls x 3 runs: 16 polls 56-59 us, 4 polls 47-48 us, 1 poll 48-56 us;
// VPC arena, 8 one-rank hosts, 500 calls x 5 runs: 16 polls 340 us median,
// 4 polls 273 us, Open MPI 298 us; bench/RESULTS-vpc.md, session 6).
// The CPUs are the kernel's, so ranks count alike when their host keys share
// the boot id, even if namespaces make them different hosts for shared memory
// (containers, the VPC arena: there 4 one-rank hosts on 2 cores at 64 polls ran
// a 64 MB allreduce 6% below gloo, at 1 poll level with it).
static std::string machineOf(const std::string& host_id) {
  if (host_id.rfind("hostid:", 0) == 0) return host_id;  // forced: one machine per key
  return host_id.substr(0, host_id.find('/'));
}

void Communicator::adaptSpin() {
  if (!env::has("HARP_SPIN")) {
    int local = 0;
    const std::string mine = machineOf(peers_[rank_].host_id);
    for (const auto& p : peers_) local += machineOf(p.host_id) == mine;
    if (local > env::availableCpus()) res_.spin = 4;
  }
  HARP_INFO_S(LogSubsys::kInit, "comm rank %d: %d polls before yielding (HARP_SPIN), none above %zu pending bytes",
              rank_, res_.spin, res_.spin_bytes);
}

// Per peer: the highest-priority transport both sides have that reaches it.
void Communicator::assignPeers(Plan& plan, const std::vector<std::vector<std::string>>& avail) const {
  plan.peers_of.assign(plan.usable.size(), {});
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    int chosen = -1;
    for (size_t i = 0; i < plan.usable.size() && chosen < 0; ++i) {
      bool theirs = std::find(avail[p].begin(), avail[p].end(), plan.usable[i]->name) != avail[p].end();
      if (theirs && plan.usable[i]->reachable(peers_[rank_], peers_[p])) chosen = static_cast<int>(i);
    }
    if (chosen < 0)
      throw Error(Error::kUnavailable, "no transport reaches rank " + std::to_string(p) + " (" + peers_[p].hostname +
                                           ")" + (plan.forced.empty() ? "" : " with HARP_TRANSPORT=" + plan.forced));
    plan.peers_of[chosen].push_back(p);
  }
}

// What every transport learns about this communicator; socket transports
// listen on the interface that reaches the bootstrap root by default.
transport::CommInfo Communicator::commInfo() const {
  transport::CommInfo info;
  info.rank = rank_;
  info.size = size_;
  info.comm_id = comm_id_;
  info.token = token_;
  info.timeout_s = timeout_s_;
  if (TcpStore* ts = tcpStoreOf(store_.get())) {
    info.bind_hint = ts->localAddress().host();
  } else {
    auto itfs = findInterfaces("");
    info.bind_hint = itfs.empty() ? "127.0.0.1" : itfs[0].addr.host();
  }
  if (info.bind_hint.find(':') != std::string::npos) info.bind_hint = "[" + info.bind_hint + "]";
  return info;
}

// Round 2: create the transports in use, publish each one's per-peer address,
// connect, and record the transport and pair of every peer.
void Communicator::connectTransports(const Plan& plan, const transport::CommInfo& info) {
  res_.transport_of.assign(size_, nullptr);
  res_.pair_of.assign(size_, nullptr);
  std::vector<std::string> blobs(size_);
  std::vector<transport::Transport*> made(plan.usable.size(), nullptr);
  for (size_t i = 0; i < plan.usable.size(); ++i) {
    if (plan.peers_of[i].empty()) continue;
    res_.transports.push_back(plan.usable[i]->create(info, peers_));
    made[i] = res_.transports.back().get();
    for (int p : plan.peers_of[i]) blobs[p] = made[i]->localAddress(p);
  }
  auto addr = storeAllgather(*store_, "addr", rank_, size_, packRuns(blobs), timeout_s_);
  for (size_t i = 0; i < plan.usable.size(); ++i) {
    transport::Transport* t = made[i];
    if (!t) continue;
    std::vector<std::string> remote;
    for (int p : plan.peers_of[i]) remote.push_back(unpackRuns(addr[p], static_cast<size_t>(size_)).at(rank_));
    t->connect(plan.peers_of[i], remote);
    for (int p : plan.peers_of[i]) {
      res_.transport_of[p] = t;
      res_.pair_of[p] = t->pair(p);
      HARP_INFO_S(LogSubsys::kNet, "comm %016llx rank %d -> rank %d (%s): transport %s", (unsigned long long)comm_id_, rank_, p,
                peers_[p].hostname.c_str(), t->name());
    }
  }
}

}  // namespace harp
