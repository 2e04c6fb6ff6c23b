#include "core/engine/communicator.h"
#include "bootstrap/crypto.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>

#include <sstream>

#include "core/algorithms/registry.h"
#include "core/engine/context.h"
#include "core/observe/recorder.h"
#include "base/env.h"
#include "base/log.h"
#include "bootstrap/rendezvous.h"
#include "base/reduce.h"
#include "core/ft/keepalive.h"
#include "core/select/select.h"
#include "core/select/tuning.h"

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

size_t bytesOf(const CollArgs& a) { return a.count * dtypeSize(a.dtype); }

// CommOptions::timeout_s < 0: HARP_TIMEOUT or 300 s; otherwise a positive
// number of seconds. inf and huge values saturate at kForeverS (~31 years), so
// every conversion downstream (ms, ns, int seconds in messages) stays in range.
double resolveTimeout(double given) {
  double t = given < 0 ? env::timeout("HARP_TIMEOUT") : env::checkTimeout(given, "timeout");
  return std::min(t, kForeverS);
}

std::string span(const void* p, size_t n) {
  char b[64];
  snprintf(b, sizeof b, "[%p, +%zu bytes)", p, n);
  return b;
}

// Send and receive ranges of one collective must be disjoint, or the receive
// range must start exactly where the algorithms support in-place operation:
// at the send buffer (`same`), or at block `r` of a p-block send buffer
// (`block`, reduce_scatter / scatter: NCCL's in-place position). `any`:
// the algorithm copes with every overlap (allgather, gather, broadcast stage
// or move their input first).
enum class Alias { kSame, kBlock, kAny };
void checkOverlap(const char* name, const void* send, size_t sbytes, const void* recv, size_t rbytes, Alias ok,
                  size_t blk, int r) {
  if (!send || !recv || !sbytes || !rbytes || ok == Alias::kAny) return;
  auto s = reinterpret_cast<uintptr_t>(send), d = reinterpret_cast<uintptr_t>(recv);
  if (s + sbytes <= d || d + rbytes <= s) return;  // disjoint
  if (ok == Alias::kSame && s == d) return;
  if (ok == Alias::kBlock && d == s + static_cast<uintptr_t>(r) * blk) return;
  throw InvalidArgument(std::string(name) + ": the send buffer " + span(send, sbytes) + " and the receive buffer " +
                        span(recv, rbytes) + " partially overlap; pass " +
                        (ok == Alias::kSame ? "the same buffer" : "the receive buffer at this rank's block of the send buffer") +
                        " for in-place operation, or separate buffers");
}

// allreduce_coalesced: each piece's buffers present and within size_t, send
// and receive the same or disjoint, no two pieces' receive buffers (or one's
// receive and another's send) overlapping; returns the total count.
size_t checkPieces(const std::vector<BufPiece>& pieces, DataType dt, int ranks) {
  const size_t es = dtypeSize(dt);
  size_t total = 0;
  std::vector<std::pair<uintptr_t, size_t>> spans;  // (start, index): receive buffers, then foreign sends
  for (size_t i = 0; i < pieces.size(); ++i) {
    const BufPiece& b = pieces[i];
    const std::string name = "allreduce_coalesced: piece " + std::to_string(i);
    if (b.count > SIZE_MAX / es / static_cast<size_t>(ranks) || total > SIZE_MAX / es / static_cast<size_t>(ranks) - b.count)
      throw InvalidArgument(name + ": count " + std::to_string(b.count) + " of " + dtypeName(dt) + " is too large");
    total += b.count;
    if (b.count == 0) continue;
    if (!b.send) throw InvalidArgument(name + ": send buffer is null");
    if (!b.recv) throw InvalidArgument(name + ": receive buffer is null");
    checkOverlap(name.c_str(), b.send, b.count * es, b.recv, b.count * es, Alias::kSame, 0, 0);
    spans.push_back({reinterpret_cast<uintptr_t>(b.recv), i});
  }
  // Receive buffers pairwise disjoint (sorted by start, each ends before the next begins).
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const BufPiece& prev = pieces[spans[k - 1].second];
    if (spans[k - 1].first + prev.count * es > spans[k].first)
      throw InvalidArgument("allreduce_coalesced: the receive buffers of pieces " + std::to_string(spans[k - 1].second) +
                            " and " + std::to_string(spans[k].second) + " overlap (" + span(prev.recv, prev.count * es) +
                            ", " + span(pieces[spans[k].second].recv, pieces[spans[k].second].count * es) + ")");
  }
  // Out of place: no piece reads a send buffer another piece's result is written into.
  for (size_t i = 0; i < pieces.size(); ++i) {
    const BufPiece& b = pieces[i];
    if (!b.count || b.send == b.recv) continue;
    const auto s = reinterpret_cast<uintptr_t>(b.send), e = s + b.count * es;
    // The receive buffer starting last before e: the only one that can reach
    // into [s, e) (they are disjoint); this piece's own ends at or before s.
    auto it = std::upper_bound(spans.begin(), spans.end(), std::make_pair(e - 1, SIZE_MAX));
    if (it == spans.begin()) continue;
    const auto& [start, j] = *std::prev(it);
    if (j != i && start + pieces[j].count * es > s)
      throw InvalidArgument("allreduce_coalesced: the send buffer of piece " + std::to_string(i) +
                            " overlaps the receive buffer of piece " + std::to_string(j));
  }
  return total;
}

// A 62-bit hash of the pieces' counts, with bit 62 set (>= 4096, so the
// collective's tag never carries it exactly and the full descriptor check runs).
int64_t layoutHash(const std::vector<BufPiece>& pieces) {
  uint64_t h = 1469598103934665603ull ^ pieces.size();  // FNV-1a over the counts
  for (const BufPiece& b : pieces) {
    for (int k = 0; k < 8; ++k) {
      h ^= (b.count >> (8 * k)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>((h & ((1ull << 62) - 1)) | (1ull << 62));
}

}  // namespace

// ---------------------------------------------------------------------------
// Work

bool Work::wait(double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  if (timeout_s < 0) {
    cv_.wait(l, [&] { return done_; });
  } else if (!cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::test() {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

bool Work::failed() {
  std::lock_guard<std::mutex> l(mu_);
  return done_ && error_;
}

std::string Work::error() {
  std::lock_guard<std::mutex> l(mu_);
  if (!error_) return "";
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    return e.what();
  }
}

void Work::finish(std::exception_ptr e) {
  std::function<void()> cb;
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    error_ = e;
    cb = std::move(on_done_);
  }
  cv_.notify_all();
  if (cb) cb();
}

// ---------------------------------------------------------------------------
// Creation

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, CommOptions opts)
    : store_(std::move(store)), rank_(rank), size_(size), opts_(std::move(opts)) {
  timeout_s_ = resolveTimeout(opts_.timeout_s);
  tuning_ = TuningTable::fromEnvironment();
  calibration_ = Calibration::fromEnvironment();
  res_.spin = static_cast<int>(std::max<long long>(1, env::integer("HARP_SPIN")));
  res_.spin_bytes = env::bytes("HARP_SPIN_BYTES");
  res_.segment_bytes = std::max<size_t>(env::bytes("HARP_SEGMENT_BYTES"), 4096);
  res_.scratch_keep = env::bytes("HARP_SCRATCH_KEEP_BYTES");
  res_.check_window = static_cast<int>(std::clamp<long long>(env::integer("HARP_CHECK_WINDOW"), 1, 64));
  res_.deferred.resize(res_.check_window + 1);
  res_.owner = this;                       // Topology
  hier_auto_ = env::flag("HARP_HIER");
}

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommOptions opts) {
  if (!store) throw InvalidArgument("no store given");
  env::warnUnknownVariables();  // once per process: misspelt HARP_* variables (base/params.def)
  double timeout = resolveTimeout(opts.timeout_s);
  // Check in first: a bad rank/size, a duplicate or a missing rank is
  // reported to every rank through the store (bootstrap/rendezvous.h).
  rendezvous(*store, rank, size, timeout);
  try {
    std::shared_ptr<Communicator> c(new Communicator(store, rank, size, std::move(opts)));
    c->connectAll();
    rendezvousDone(*store);
    c->attachRecorder();  // flight recorder
    return c;
  } catch (const Error& e) {
    postRendezvousError(*store, e.kind() == Error::kInvalidArgument ? Error::kPeerFailure : e.kind(),
                        describeRank(rank) + " failed to create the communicator: " + e.what());
    throw;
  } catch (const std::exception& e) {
    postRendezvousError(*store, Error::kPeerFailure, describeRank(rank) + " failed to create the communicator: " +
                                                         e.what());
    throw;
  }
}

// Refusals that mean a unique id's store has retired (a live store under load
// delays a connection; it does not refuse one).
constexpr double kRetiredStoreS = 3;

// A unique id serves one communicator: its store retires once that
// communicator formed and every rank let go, so a reused id finds nothing
// listening (bootstrap/bootstrap.h, UniqueId::listening).
std::shared_ptr<Communicator> Communicator::create(const UniqueId& id, int rank, int size, CommOptions opts) {
  double t = resolveTimeout(opts.timeout_s);
  std::shared_ptr<TcpStore> store;
  try {
    store = std::make_shared<TcpStore>(id.address(), id.secret(), t, id.listening() ? kRetiredStoreS : -1);
  } catch (const Error& e) {
    if (!id.listening() || std::strstr(e.what(), "nothing listens") == nullptr) throw;
    throw InvalidArgument(describeRank(rank) + ": unique id already used, or its creator exited: its store at " +
                          id.address().str() + " has retired (" + e.what() + "). A unique id serves one "
                          "communicator; create a new one (harp.get_unique_id(), ncclGetUniqueId) for each");
  }
  return create(std::make_shared<PrefixStore>(store, "c/"), rank, size, std::move(opts));
}

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

Communicator::~Communicator() {
  try {
    destroy();
  } catch (...) {
  }
}

std::string Communicator::payloadMac(const std::string& label, const std::string& msg) const {
  std::string bound(reinterpret_cast<const char*>(&comm_id_), sizeof comm_id_);
  return crypto::hmacSha256(crypto::deriveKey(token_, "payload|" + label), bound + msg);
}

std::string Communicator::transportName(int peer) const {
  if (peer < 0 || peer >= size_) throw InvalidArgument("peer " + std::to_string(peer) + " out of range");
  if (peer == rank_) return "self";
  return res_.transport_of[peer] ? res_.transport_of[peer]->name() : "none";
}

// ---------------------------------------------------------------------------
// Validation and algorithm choice

void Communicator::validate(const CollArgs& a) const {
  const char* name = collName(a.coll);
  if (static_cast<unsigned>(a.coll) >= kNumCollTypes) throw InvalidArgument("unknown collective");
  dtypeSize(a.dtype);
  if (collReduces(a.coll)) checkOpSupported(a.dtype, a.op);
  const bool rooted = collRooted(a.coll);
  if (rooted && (a.root < 0 || a.root >= size_))
    throw InvalidArgument(std::string(name) + ": root " + std::to_string(a.root) + " is out of range for " +
                          std::to_string(size_) + " ranks");
  if ((a.coll == CollType::kSend || a.coll == CollType::kRecv) && (a.peer < 0 || a.peer >= size_ || a.peer == rank_))
    throw InvalidArgument(std::string(name) + ": peer " + std::to_string(a.peer) + " is not another rank of " +
                          std::to_string(size_));
  if (a.coll == CollType::kP2pBatch) {
    for (const P2pOp& o : a.p2p) {
      if (o.peer < 0 || o.peer >= size_)
        throw InvalidArgument(std::string(o.send ? "send" : "recv") + ": peer " + std::to_string(o.peer) +
                              " is out of range for " + std::to_string(size_) + " ranks");
      if (o.count > 0 && !o.buf)
        throw InvalidArgument(std::string(o.send ? "send" : "recv") + ": buffer is null");
    }
    return;
  }
  if (a.coll == CollType::kAllreduceCoalesced) {
    if (a.op == ReduceOp::kAvg && isInteger(a.dtype))
      throw InvalidArgument(std::string("allreduce_coalesced: avg of ") + dtypeName(a.dtype) +
                            " is not supported (integer avg widens its data; use allreduce per buffer)");
    if (checkPieces(a.pieces, a.dtype, size_) != a.count)
      throw InvalidArgument("allreduce_coalesced: count " + std::to_string(a.count) + " is not the pieces' total");
    if (!a.opts.algo.empty() && !findAlgorithm(a.coll, a.opts.algo))
      throw InvalidArgument("allreduce_coalesced: unknown algorithm '" + a.opts.algo + "' (known: " +
                            algorithmList(a.coll) + ")");
    return;
  }
  const bool vcounts = collVcounts(a.coll);  // per-rank counts: `count` does not describe the call
  if (vcounts) {
    if (a.sendcounts.size() != (size_t)size_ || a.sdispls.size() != (size_t)size_ ||
        a.recvcounts.size() != (size_t)size_ || a.rdispls.size() != (size_t)size_)
      throw InvalidArgument(std::string(name) + ": counts and displacements need one entry per rank (" + std::to_string(size_) + ")");
  }
  if (a.coll == CollType::kBarrier) return;
  if (a.count > 0 || vcounts) {
    bool needs_send = a.coll != CollType::kRecv && !(a.coll == CollType::kScatter && a.root != rank_) &&
                      a.coll != CollType::kBroadcast;
    bool needs_recv = a.coll != CollType::kSend && !(a.coll == CollType::kReduce && a.root != rank_) &&
                      !(a.coll == CollType::kGather && a.root != rank_);
    if (a.coll == CollType::kBroadcast && !a.recvbuf) throw InvalidArgument("broadcast: buffer is null");
    if (vcounts) {
      size_t s = std::accumulate(a.sendcounts.begin(), a.sendcounts.end(), size_t{0});
      size_t r = std::accumulate(a.recvcounts.begin(), a.recvcounts.end(), size_t{0});
      needs_send = s > 0;
      needs_recv = r > 0;
    }
    if (needs_send && !a.sendbuf) throw InvalidArgument(std::string(name) + ": send buffer is null");
    if (needs_recv && !a.recvbuf) throw InvalidArgument(std::string(name) + ": receive buffer is null");
  }
  if (!vcounts) checkBuffers(a);
  if (!a.opts.algo.empty() && !findAlgorithm(a.coll, a.opts.algo))
    throw InvalidArgument(std::string(name) + ": unknown algorithm '" + a.opts.algo + "' (known: " +
                          algorithmList(a.coll) + ")");
}

// Sizes fit size_t, and send/receive ranges overlap only where supported.
void Communicator::checkBuffers(const CollArgs& a) const {
  const char* name = collName(a.coll);
  const size_t es = dtypeSize(a.dtype), p = static_cast<size_t>(size_);
  if (a.count > SIZE_MAX / es / p)
    throw InvalidArgument(std::string(name) + ": count " + std::to_string(a.count) + " of " + dtypeName(a.dtype) +
                          " is too large");
  const size_t blk = a.count * es, all = blk * p;
  const bool root = a.root == rank_;
  switch (a.coll) {
    case CollType::kAllreduce:
      return checkOverlap(name, a.sendbuf, blk, a.recvbuf, blk, Alias::kSame, 0, 0);
    case CollType::kReduce:
      if (root) checkOverlap(name, a.sendbuf, blk, a.recvbuf, blk, Alias::kSame, 0, 0);
      return;
    case CollType::kAlltoall:
      return checkOverlap(name, a.sendbuf, all, a.recvbuf, all, Alias::kSame, 0, 0);
    case CollType::kReduceScatter:
      return checkOverlap(name, a.sendbuf, all, a.recvbuf, blk, Alias::kBlock, blk, rank_);
    case CollType::kScatter:
      if (root) checkOverlap(name, a.sendbuf, all, a.recvbuf, blk, Alias::kBlock, blk, rank_);
      return;
    default:
      return;
  }
}

namespace {
SelectQuery queryOf(const CollArgs& a, int ranks, const std::string& transport, const Topology& topo, bool hier) {
  SelectQuery q;
  q.coll = a.coll;
  q.count = a.count;
  q.bytes = bytesOf(a);
  q.ranks = ranks;
  q.transport = transport;
  q.in_place = a.sendbuf && a.sendbuf == a.recvbuf;
  q.op = a.op;
  q.user_algo = a.opts.algo;
  q.hosts = topo.hosts;  // Topology
  q.min_local = topo.min_local;
  q.max_local = topo.max_local;
  q.blocked = topo.blocked;
  q.hier_auto = hier;
  return q;
}
}  // namespace

std::string Communicator::chooseAlgorithm(const CollArgs& a) const {
  return selectAlgorithm(queryOf(a, size_, transport_kind_, topo_, hier_auto_), tuning_, calibration_, false).pick->name;
}

std::string Communicator::lastAlgorithm(CollType c) {
  std::lock_guard<std::mutex> ex(exec_mu_);
  const size_t slot = static_cast<size_t>(c);
  return slot < std::size(algo_memo_) && algo_memo_[slot].algo ? algo_memo_[slot].algo->name : "";
}

const Algorithm* Communicator::algorithmFor(const CollArgs& a) {
  const SelectQuery q = queryOf(a, size_, transport_kind_, topo_, hier_auto_);
  const size_t slot = static_cast<size_t>(a.coll);
  const bool memo = a.opts.algo.empty() && slot < std::size(algo_memo_);
  if (memo && algo_memo_[slot].algo && algo_memo_[slot].bytes == q.bytes && algo_memo_[slot].in_place == q.in_place)
    return algo_memo_[slot].algo;
  const Selection sel = selectAlgorithm(q, tuning_, calibration_, false);
  const bool fell_back = !sel.named_failed.empty() && sel.source == PickSource::kUser;
  if (fell_back || logLevel() >= LogLevel::kInfo) {
    std::string key = std::string(collName(a.coll)) + "/" + sel.pick->name + "/" + sel.why;
    if (std::find(logged_algos_.begin(), logged_algos_.end(), key) == logged_algos_.end()) {
      logged_algos_.push_back(key);
      if (fell_back)
        HARP_WARN("%s: %s (%zu bytes, %d ranks)", collName(a.coll), sel.reason().c_str(), q.bytes, size_);
      else
        HARP_INFO_S(LogSubsys::kTuning, "%s: algorithm %s (%zu bytes, %d ranks): %s", collName(a.coll), sel.pick->name, q.bytes, size_,
                  sel.reason().c_str());
    }
  }
  if (memo) algo_memo_[slot] = {q.bytes, q.in_place, sel.pick};
  return sel.pick;
}

// ---------------------------------------------------------------------------
// Execution

// Calls on one communicator must not overlap: ranks pair collectives by call
// order, which two threads racing on one communicator make differ between
// ranks (wrong data with no error). owner_ holds the OS thread id of the
// thread inside submit()/run() (0: none); one compare-exchange and one store
// per call. An overlapping call from another thread breaks the communicator
// (on every rank: the pairing can no longer be trusted) and raises
// InvalidArgumentError naming both threads. Sequential calls from different
// threads are fine; the worker thread never enters here.
namespace {
uint64_t thisThreadId() {
  static thread_local const uint64_t id = static_cast<uint64_t>(::syscall(SYS_gettid));
  return id;
}
}  // namespace

class Communicator::CallGuard {
 public:
  CallGuard(Communicator& c, const CollArgs& a) : c_(c) {
    const uint64_t me = thisThreadId();
    uint64_t cur = 0;
    if (c_.owner_.compare_exchange_strong(cur, me, std::memory_order_acquire)) return;
    if (cur == me) {  // nested call on this thread (split's own collectives)
      nested_ = true;
      return;
    }
    std::string why = std::string(collName(a.coll)) + " called on thread " + std::to_string(me) +
                      " while thread " + std::to_string(cur) +
                      " is inside a call on the same communicator: calls on one communicator must not overlap "
                      "(see README, Threading); the communicator is now broken on every rank";
    c_.markBroken("concurrent use: " + why);
    throw InvalidArgument(why);
  }
  ~CallGuard() {
    if (!nested_) c_.owner_.store(0, std::memory_order_release);
  }

 private:
  Communicator& c_;
  bool nested_ = false;
};

std::shared_ptr<Work> Communicator::submit(CollArgs args, bool async) {
  CallGuard guard(*this, args);
  if (destroyed_) throw InvalidArgument("communicator has been destroyed");
  validate(args);
  if (broken_.load()) {
    std::lock_guard<std::mutex> g(broken_mu_);
    throw Error(broken_kind_, broken_reason_);
  }
  auto w = std::make_shared<Work>();
  if (!async) {
    std::unique_lock<std::mutex> ql(q_mu_);
    if (in_flight_ == 0) {
      ql.unlock();
      std::lock_guard<std::mutex> ex(exec_mu_);
      execute(args, *w);
      w->wait();
      return w;
    }
  }
  {
    std::lock_guard<std::mutex> ql(q_mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] {
      env::nameThread("harp-worker");
      workerLoop();
    });
    queue_.emplace_back(std::move(args), w);
    ++in_flight_;
  }
  q_cv_.notify_one();
  if (!async) w->wait();
  return w;
}

void Communicator::run(CollArgs args) {
  CallGuard guard(*this, args);
  {
    std::unique_lock<std::mutex> ql(q_mu_);
    if (in_flight_ != 0 || destroyed_) {  // behind queued work: wait like submit() does
      ql.unlock();
      submit(std::move(args), false);
      return;
    }
  }
  validate(args);
  std::lock_guard<std::mutex> ex(exec_mu_);
  runCollective(args);
}

void Communicator::workerLoop() {
  for (;;) {
    std::pair<CollArgs, std::shared_ptr<Work>> item;
    {
      std::unique_lock<std::mutex> l(q_mu_);
      q_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    {
      std::lock_guard<std::mutex> ex(exec_mu_);
      execute(item.first, *item.second);
    }
    {
      std::lock_guard<std::mutex> l(q_mu_);
      --in_flight_;
    }
  }
}

void Communicator::execute(CollArgs& a, Work& w) {
  try {
    runCollective(a);
    w.finish(nullptr);
  } catch (...) {
    w.finish(std::current_exception());
  }
}

namespace {
bool isSigned(DataType t) { return t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64; }
// The descriptor messages a rooted collective's data makes redundant
// (core/engine/context.h, CheckShape): only with an exact tag and data on this
// communicator's own pairs (not a hierarchical algorithm's sub-communicators),
// and only the shape the algorithm declares its message pattern safe for
// (AlgorithmSpec::root_check). Reduce and tree gathers keep the full exchange:
// their data reaches the root through inner ranks.
Context::CheckShape checkShape(const CollArgs& a, const Descriptor& d, const Algorithm& algo) {
  if (a.count == 0 || !tagIsExact(d.root, d.count) || algo.hier_cost) return Context::CheckShape::kAll;
  if ((a.coll == CollType::kBroadcast || a.coll == CollType::kScatter) && algo.root_check == RootCheck::kFromRoot)
    return Context::CheckShape::kFromRoot;
  if (a.coll == CollType::kGather && algo.root_check == RootCheck::kToRoot) return Context::CheckShape::kToRoot;
  return Context::CheckShape::kAll;
}
// This rank does not wait for its peers' descriptors in this rooted call
// (core/engine/context.h): it only sends data (the broadcast and scatter root, the
// reduce and gather non-roots; a reduce's inner ranks do receive, and their
// data's tags are compared in the call), or (kFromRoot) it receives data that
// vouches for the root and compares the descriptors that came while it waited.
bool defersCheck(const CollArgs& a, int rank, Context::CheckShape shape) {
  if (a.count == 0) return false;  // checked before the algorithm, in the call
  if (a.coll == CollType::kBroadcast || a.coll == CollType::kScatter)
    return a.root == rank || shape == Context::CheckShape::kFromRoot;
  return (a.coll == CollType::kReduce || a.coll == CollType::kGather) && a.root != rank;
}
}  // namespace

// Descriptor agreement. Every message's tag carries the descriptor (exact for
// root < 4096, count < 2^32), so a receiver finds a disagreement with its
// sender. That is not enough where a rank only sends (broadcast/scatter root,
// gather and reduce leaves) or where ranks disagree about the root (they
// then disagree about who talks to whom and may wait for messages nobody
// sends). Rooted collectives therefore run the exact descriptor check of
// Context::startCheck alongside the data (posted first, compared while
// waiting, completed at the end): every rank hears from every rank, directly
// or through data that only agreeing ranks forward (checkShape). A rank whose
// data disagrees raises MismatchError in the call; one that only sent, or
// whose data agreed (defersCheck), raises at a later call (by its next
// non-deferring call, HARP_CHECK_WINDOW calls, or destroy()). Cost: with an
// exact tag each broadcast/scatter receiver sends its 24-byte descriptor to its
// p-1 peers and nobody waits for one; ABBA figures against the tree before the
// check in bench/RESULTS.md ("Deferred root check"). Large messages unchanged.
// Allreduce pays only the closing check (closingCheck). Zero counts and
// descriptors the tag cannot carry run the check before the algorithm (a rank
// with count 0 would otherwise return before anyone could compare).
void Communicator::runCollective(CollArgs& a) {
  if (broken_.load()) {
    std::lock_guard<std::mutex> g(broken_mu_);
    throw Error(broken_kind_, broken_reason_);
  }
  if (a.op == ReduceOp::kAvg && collReduces(a.coll) && isInteger(a.dtype) && size_ > 1) return runIntAvg(a);
  runWith(a, a.dtype);
}

// `a` runs as is; the tag and descriptor name `user_dtype` (runIntAvg runs
// widened data under the caller's dtype, so disagreements stay visible).
void Communicator::runWith(CollArgs& a, DataType user_dtype) {
  const double timeout = a.opts.timeout_s > 0 ? a.opts.timeout_s : timeout_s_;
  // Compression: a compressed float32 allreduce runs its own algorithm, whose
  // reserved index in the tag and descriptor keeps ranks that disagree apart (core/compress/compress.h).
  const Algorithm* algo = a.coll == CollType::kAllreduce && a.compress.kind != CompressKind::kNone
                              ? compressedAlgorithm(a) : nullptr;
  if (!algo) algo = algorithmFor(a);
  const bool p2p = a.coll == CollType::kSend || a.coll == CollType::kRecv || a.coll == CollType::kP2pBatch;
  const bool rooted = collRooted(a.coll);
  Descriptor d;
  uint64_t tag;
  bool check = false;
  if (p2p) {
    // send and recv share one tag kind; the full 32-bit user tag travels.
    tag = makeP2pTag(a.dtype, a.tag);
  } else {
    d.seq = ++seq_;
    d.coll = static_cast<uint8_t>(a.coll);
    d.dtype = static_cast<uint8_t>(user_dtype);
    d.op = static_cast<uint8_t>(collReduces(a.coll) ? a.op : ReduceOp::kSum);
    d.algo = static_cast<uint8_t>(algo->index);
    d.root = rooted ? a.root : a.coll == CollType::kAllreduceCoalesced ? layoutHash(a.pieces) : 0;
    d.count = a.count;
    tag = makeTag(d.seq, a.coll, user_dtype, static_cast<ReduceOp>(d.op), static_cast<int>(d.root), d.count, d.algo);
    check = a.coll != CollType::kBarrier && !collVcounts(a.coll) && size_ > 1 &&
            (rooted || a.count == 0 || !tagIsExact(d.root, d.count));
  }
  obs::OpScope recorded(recorder_.get(), a, algo, user_dtype, p2p ? 0 : d.seq);  // flight recorder
  // The Context outlives the catch below: markBroken() fails the
  // transports' pending requests, which live in it (destroyed first, they were
  // freed memory the abort wrote to: "double free or corruption" in failAll).
  std::optional<Context> live;
  try {
    Context& ctx = live.emplace(res_, rank_, size_, a, tag, timeout);
    if (check) {
      const Context::CheckShape shape = rooted ? checkShape(a, d, *algo) : Context::CheckShape::kAll;
      ctx.startCheck(d, shape, rooted && defersCheck(a, rank_, shape));
      if (!rooted || a.count == 0) ctx.finishCheck();
    }
    algo->fn(ctx);
    if (check) ctx.finishCheck();
    ctx.settleDeferred();  // an earlier call's, where this rank only sent
    if (!p2p) closingCheck(a, d.seq, ctx.hearsFromAll());
    recorded.ok();
  } catch (const Error& e) {
    if (e.kind() == Error::kInvalidArgument) throw;
    // An earlier call's deferred check that shows a disagreement explains this
    // failure (e.g. a peer's abort reached a shm allreduce's own wait first).
    const bool named = dynamic_cast<const DeferredCheckError*>(&e) != nullptr;  // thrown by the check itself
    const std::string earlier = live && !named ? live->deferredFinding() : std::string();
    if (!earlier.empty()) {
      std::string why = earlier + "; " + e.what();
      markBroken(why);
      throw Error(Error::kMismatch, why);
    }
    // A timeout (this rank's or a peer's) gains the op-count view
    // naming the ranks that never started this collective.
    std::string why = obs::withOpCounts(recorder_.get(), e.what());
    markBroken(why);
    // A transport's failure text quoting a revocation is a revocation
    if (e.kind() == Error::kPeerFailure && noticeKind(why) == Error::kRevoked) throw Error(Error::kRevoked, why);
    if (e.kind() == Error::kPeerFailure) {
      std::string dead = keepAliveVerdict(why);  // name the dead rank(s)
      if (!dead.empty()) throw Error(Error::kPeerFailure, why + "; " + dead);
    }
    if (why.size() == std::strlen(e.what())) throw;
    throw Error(e.kind(), why);
  }
  live.reset();
  res_.scratch.trim(res_.scratch_keep);  // no high-water mark above the cap (core/engine/scratch.h)
  if (a.op == ReduceOp::kAvg && !isInteger(a.dtype)) {
    if (a.coll == CollType::kAllreduce || a.coll == CollType::kReduceScatter ||
        (a.coll == CollType::kReduce && a.root == rank_))
      finalizeAvg(a.recvbuf, a.count, a.dtype, size_);
    if (a.coll == CollType::kAllreduceCoalesced)
      for (const BufPiece& b : a.pieces) finalizeAvg(b.recv, b.count, a.dtype, size_);
  }
}

// Integer avg without wrap-around: the sum of p values overflows the type
// long before the average does. 8- and 32-bit integers travel as 64-bit sums
// (|sum| <= p * 2^32, exact); 64-bit integers travel as (x div p, x mod p)
// pairs, whose sums fit, and the exact truncated average is put together at
// the end (wideAvgIn / wideAvgOut in core/reduce). Costs 2-8x the bytes of a
// plain sum and a copy in and out; only integer avg pays it.
void Communicator::runIntAvg(CollArgs& a) {
  const size_t n = a.count;
  const size_t w = wideAvgWidth(a.dtype);  // int64 words per element
  const bool rs = a.coll == CollType::kReduceScatter;
  const size_t blocks = rs ? static_cast<size_t>(size_) : 1;
  if (n > SIZE_MAX / 8 / w / blocks)
    throw InvalidArgument(std::string(collName(a.coll)) + ": count " + std::to_string(n) + " too large for avg");
  const bool want_out = a.coll != CollType::kReduce || a.root == rank_;
  // mmap'd (core/engine/scratch.h), unmapped on return: never a heap high-water mark
  Scratch in_block, out_block;
  auto* in = static_cast<int64_t*>(in_block.reserve(blocks * n * w * 8));
  auto* out = static_cast<int64_t*>(out_block.reserve(want_out ? n * w * 8 : 0));
  const size_t es = dtypeSize(a.dtype);
  for (size_t b = 0; b < blocks; ++b)
    wideAvgIn(in + b * n * w, static_cast<const char*>(a.sendbuf) + b * n * es, n, a.dtype, size_);
  CollArgs wide = a;
  wide.sendbuf = in;
  wide.recvbuf = want_out ? out : nullptr;
  wide.count = n * w;
  wide.dtype = isSigned(a.dtype) ? DataType::kInt64 : DataType::kUint64;
  runWith(wide, a.dtype);
  if (want_out) wideAvgOut(a.recvbuf, out, n, a.dtype, size_);
}

// A peer's abort notice that arrived while this collective ran (its data may
// all have come before it): the collective fails, like every later call.
// shm: one load per peer; tcp: one poll(2) per collective. Not where the call
// left a deferred check that hears from every peer (deferred): a peer that
// aborted before this call fails that check, raised at a later call.
void Communicator::closingCheck(const CollArgs& a, uint32_t seq, bool deferred) {
  for (auto& t : res_.transports) {
    if (deferred) break;
    std::string notice = t->abortNotice();
    if (notice.empty()) continue;
    // "after collective #N": the aborting rank had completed collective N.
    static const std::string kMark = "after collective #";
    size_t at = notice.find(kMark);
    if (at != std::string::npos && std::strtoull(notice.c_str() + at + kMark.size(), nullptr, 10) >= seq) continue;
    throw Error(noticeKind(notice), std::string(collName(a.coll)) + " on rank " + std::to_string(rank_) + " failed: " + notice);
  }
  // Completed here: record it, unless abort() came first (then it said the
  // last completed collective was the one before, so this one fails too).
  uint64_t w = done_word_.load(std::memory_order_acquire);
  do {
    if (w & 1) {
      std::lock_guard<std::mutex> g(broken_mu_);
      throw Error(broken_kind_, broken_reason_);
    }
  } while (!done_word_.compare_exchange_weak(w, static_cast<uint64_t>(seq) << 1, std::memory_order_acq_rel));
}

void Communicator::markBroken(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(broken_mu_);
    if (broken_.load()) return;
    broken_reason_ = why;
    broken_kind_ = Error::kPeerFailure;
    if (why.find("mismatch") != std::string::npos) broken_kind_ = Error::kMismatch;
    if (why.find("timed out") != std::string::npos) broken_kind_ = Error::kTimeout;
    if (why.find(kRevokedMark) != std::string::npos) broken_kind_ = Error::kRevoked;
    broken_.store(true);
  }
  HARP_WARN("communicator broken: %s", why.c_str());
  recordFailure(why);  // flight-record dump (HARP_FR_DUMP_ON_FAILURE)
  // The notice says which collective this rank completed last, so a peer that
  // finishes that one as well keeps it (closingCheck): ranks agree on it.
  const uint64_t done = done_word_.fetch_or(1, std::memory_order_acq_rel) >> 1;
  // The kind goes first: transports may truncate the text (shm keeps ~180 bytes).
  const bool mismatch = broken_kind_ == Error::kMismatch;
  const std::string notice =
      "after collective #" + std::to_string(done) + ": " + (mismatch ? "collective mismatch: " : "") + why;
  for (auto& t : res_.transports) t->abort(notice);
  abortSubComms(notice);  // Topology: peers waiting in a sub-communicator learn it too
}

std::string Communicator::brokenReason() {
  std::lock_guard<std::mutex> g(broken_mu_);
  return broken_reason_;
}

void Communicator::abort(const std::string& reason) {
  markBroken("aborted by rank " + std::to_string(rank_) + ": " + reason);
}

void Communicator::refuseRooted(CollType c, const std::string& why) {
  if (size_ > 1 && collRooted(c))
    markBroken("rank " + std::to_string(rank_) + ", the root, refused its own " + collName(c) + " arguments: " + why);
}

void Communicator::destroy() {
  {
    std::lock_guard<std::mutex> l(q_mu_);
    if (destroyed_) return;
    destroyed_ = true;
    stop_ = true;
  }
  stopKeepAlive();  // before the transports its callback aborts go
  q_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> ex(exec_mu_);
  // The last rooted call's deferred check (this rank only sent in it): the
  // error is raised once everything below is released.
  std::exception_ptr late;
  try {
    settleDeferred();
  } catch (...) {
    late = std::current_exception();
  }
  try {
    destroySubComms();  // Topology
  } catch (...) {
    if (!late) late = std::current_exception();
  }
  retireRecorder();  // off the process list, and lets go of the store
  store_.reset();  // closes a TcpStore connection now (the root may then retire)
  res_.transports.clear();
  res_.scratch.trim(0);
  res_.pair_of.assign(size_, nullptr);
  res_.transport_of.assign(size_, nullptr);
  res_.deferred_n = 0;
  if (late) std::rethrow_exception(late);
}

// destroy(): wait (up to the communicator's timeout) for the descriptors a
// deferred check still lacks and compare them; a broken communicator has
// reported its error already.
void Communicator::settleDeferred() {
  if (res_.deferred_n == 0 || broken_.load() || res_.transports.empty()) return;
  CollArgs a;
  const Descriptor& d = res_.deferred[res_.deferred_head].mine;
  a.coll = static_cast<CollType>(d.coll);
  try {
    Context ctx(res_, rank_, size_, a, makeCheckTag(d.seq), timeout_s_);
    ctx.settleDeferred();
  } catch (const Error& e) {
    markBroken(e.what());  // peers still waiting learn it too
    throw;
  }
}

// ---------------------------------------------------------------------------
// Convenience wrappers

std::shared_ptr<Work> Communicator::allreduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                                              CollOptions o, bool async) {
  CollArgs a;
  a.coll = CollType::kAllreduce;
  a.sendbuf = send;
  a.recvbuf = recv;
  a.count = count;
  a.dtype = dt;
  a.op = op;
  a.opts = std::move(o);
  return submit(std::move(a), async);
}

std::shared_ptr<Work> Communicator::allreduceCoalesced(std::vector<BufPiece> pieces, DataType dt, ReduceOp op,
                                                       CollOptions o, bool async) {
  CollArgs a;
  a.coll = CollType::kAllreduceCoalesced;
  size_t total = 0;
  for (const BufPiece& b : pieces) total += b.count;  // overflow: validate() names the piece
  a.count = total;
  a.pieces = std::move(pieces);
  a.dtype = dt;
  a.op = op;
  a.opts = std::move(o);
  return submit(std::move(a), async);
}

std::shared_ptr<Work> Communicator::broadcast(void* buf, size_t count, DataType dt, int root, CollOptions o,
                                              bool async) {
  CollArgs a;
  a.coll = CollType::kBroadcast;
  a.sendbuf = buf;
  a.recvbuf = buf;
  a.count = count;
  a.dtype = dt;
  a.root = root;
  a.opts = std::move(o);
  return submit(std::move(a), async);
}

std::shared_ptr<Work> Communicator::barrier(bool async) {
  CollArgs a;
  a.coll = CollType::kBarrier;
  return submit(std::move(a), async);
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  // Everyone shares (color, key); same-color ranks form a communicator whose
  // rendezvous keys live under a prefix unique to this split.
  std::vector<int64_t> mine{color, key}, all(2 * size_);
  CollArgs a;
  a.coll = CollType::kAllgather;
  a.sendbuf = mine.data();
  a.recvbuf = all.data();
  a.count = 2;
  a.dtype = DataType::kInt64;
  submit(std::move(a), false);
  int seq = ++split_seq_;
  // The new communicators rendezvous through the store, which may live in
  // another rank's process (rank 0 hosts the unique id's server): a barrier
  // on this communicator keeps every rank here until all are done with it.
  std::shared_ptr<Communicator> made;
  std::exception_ptr err;
  if (color >= 0) {
    try {
      made = splitCreate(all, color, seq);
    } catch (...) {
      err = std::current_exception();
    }
  }
  barrier(false);
  if (err) std::rethrow_exception(err);
  return made;
}

std::shared_ptr<Communicator> Communicator::splitCreate(const std::vector<int64_t>& all, int color, int seq) {
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size_; ++r)
    if (all[2 * r] == color) members.push_back({all[2 * r + 1], r});
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank_) new_rank = static_cast<int>(i);
  std::string prefix = "split" + std::to_string(comm_id_) + "." + std::to_string(seq) + "." + std::to_string(color) + "/";
  CommOptions o = opts_;
  o.timeout_s = timeout_s_;
  auto made = create(std::make_shared<PrefixStore>(store_, prefix), new_rank, static_cast<int>(members.size()), o);
  // The flight record names the parent's global ranks.
  if (made->recorder_ && recorder_) {
    std::vector<int> parent = recorder_->globalRanks(), g;
    for (auto& m : members) g.push_back(parent.at(m.second));
    made->recorder_->setGlobalRanks(std::move(g));
  }
  return made;
}

}  // namespace harp
