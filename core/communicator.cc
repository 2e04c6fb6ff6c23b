#include "core/communicator.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <sstream>

#include "core/algorithms/registry.h"
#include "core/context.h"
#include "core/env.h"
#include "core/log.h"
#include "core/rendezvous.h"
#include "core/reduce.h"
#include "core/tuning.h"

namespace harp {
namespace {

// Length-prefixed string lists, for blobs exchanged through the store.
std::string pack(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) {
    uint32_t n = static_cast<uint32_t>(s.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += s;
  }
  return out;
}

std::vector<std::string> unpack(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i + 4 <= s.size()) {
    uint32_t n;
    std::memcpy(&n, s.data() + i, 4);
    i += 4;
    if (i + n > s.size()) throw Error(Error::kInternal, "corrupt bootstrap record");
    v.push_back(s.substr(i, n));
    i += n;
  }
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
  double t = given < 0 ? env::timeout("HARP_TIMEOUT", 300.0) : env::checkTimeout(given, "timeout");
  return std::min(t, kForeverS);
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
  spin_ = static_cast<int>(std::max<long long>(1, env::integer("HARP_SPIN", 64)));
  segment_bytes_ = std::max<size_t>(env::bytes("HARP_SEGMENT_BYTES", 512 << 10), 4096);
}

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommOptions opts) {
  if (!store) throw InvalidArgument("no store given");
  double timeout = resolveTimeout(opts.timeout_s);
  // Check in first: a bad rank/size, a duplicate or a missing rank is
  // reported to every rank through the store (core/rendezvous.h).
  rendezvous(*store, rank, size, timeout);
  try {
    std::shared_ptr<Communicator> c(new Communicator(store, rank, size, std::move(opts)));
    c->connectAll();
    rendezvousDone(*store);
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

std::shared_ptr<Communicator> Communicator::create(const UniqueId& id, int rank, int size, CommOptions opts) {
  double t = resolveTimeout(opts.timeout_s);
  auto store = std::make_shared<TcpStore>(id.address(), id.secret(), t);
  return create(std::make_shared<PrefixStore>(store, "c/"), rank, size, std::move(opts));
}

void Communicator::connectAll() {
  setLogRank(rank_);
  // Rank 0 draws the communicator id and connection token; everyone reads them.
  if (rank_ == 0) store_->set("token", randomBytes(24));
  std::string tok = rendezvousGet(*store_, "token", timeout_s_);
  if (tok.size() != 24) throw Error(Error::kInternal, "corrupt rendezvous token (" + std::to_string(tok.size()) + " bytes)");
  token_ = tok.substr(0, 16);
  std::memcpy(&comm_id_, tok.data() + 16, 8);

  // Which transports can run here, and which one the user forces.
  std::string forced = !opts_.transport.empty() ? opts_.transport : env::str("HARP_TRANSPORT");
  if (forced == "auto") forced.clear();
  std::vector<const transport::TransportSpec*> usable;
  for (const auto& spec : transport::registeredTransports()) {
    if (!forced.empty() && spec.name != forced) continue;
    std::string why = spec.unavailable ? spec.unavailable() : "";
    if (!why.empty()) {
      if (!forced.empty()) throw Error(Error::kUnavailable, "HARP_TRANSPORT=" + forced + ": " + why);
      HARP_INFO("transport %s unavailable: %s", spec.name.c_str(), why.c_str());
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

  // Round 1: who is where, and what can they run.
  HostIdentity me = thisHost();
  std::vector<std::string> mine{me.host_id, me.hostname, std::to_string(me.pid)};
  for (auto* s : usable) mine.push_back(s->name);
  auto all = storeAllgather(*store_, "info", rank_, size_, pack(mine), timeout_s_);
  peers_.resize(size_);
  std::vector<std::vector<std::string>> avail(size_);
  for (int r = 0; r < size_; ++r) {
    auto v = unpack(all[r]);
    peers_[r].rank = r;
    peers_[r].host_id = v.at(0);
    peers_[r].hostname = v.at(1);
    peers_[r].pid = std::stoi(v.at(2));
    avail[r].assign(v.begin() + 3, v.end());
  }

  // Ranks sharing this host with more ranks than it has cores must not spin
  // long while waiting: the peer they wait for needs the core (measured on 2
  // cores, 4 ranks, 8-byte allreduce over TCP: 64 polls ~150 us, 16 polls ~85 us).
  if (!env::has("HARP_SPIN")) {
    int local = 0;
    for (const auto& p : peers_) local += p.host_id == peers_[rank_].host_id;
    if (local > env::availableCpus()) spin_ = 16;
  }
  HARP_INFO("comm rank %d: %d polls before yielding (HARP_SPIN)", rank_, spin_);

  // Per peer: the highest-priority transport both sides have that reaches it.
  transport_of_.assign(size_, nullptr);
  pair_of_.assign(size_, nullptr);
  std::vector<std::vector<int>> peers_of(usable.size());
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    int chosen = -1;
    for (size_t i = 0; i < usable.size() && chosen < 0; ++i) {
      bool theirs = std::find(avail[p].begin(), avail[p].end(), usable[i]->name) != avail[p].end();
      if (theirs && usable[i]->reachable(peers_[rank_], peers_[p])) chosen = static_cast<int>(i);
    }
    if (chosen < 0)
      throw Error(Error::kUnavailable, "no transport reaches rank " + std::to_string(p) + " (" + peers_[p].hostname +
                                           ")" + (forced.empty() ? "" : " with HARP_TRANSPORT=" + forced));
    peers_of[chosen].push_back(p);
  }

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

  // Round 2: per-peer addresses of the transports in use.
  std::vector<std::string> blobs(size_);
  std::vector<int> transport_index(size_, -1);
  for (size_t i = 0; i < usable.size(); ++i) {
    if (peers_of[i].empty()) continue;
    transports_.push_back(usable[i]->create(info, peers_));
    for (int p : peers_of[i]) {
      transport_index[p] = static_cast<int>(transports_.size() - 1);
      blobs[p] = transports_.back()->localAddress(p);
    }
  }
  auto addr = storeAllgather(*store_, "addr", rank_, size_, pack(blobs), timeout_s_);
  size_t ti = 0;
  for (size_t i = 0; i < usable.size(); ++i) {
    if (peers_of[i].empty()) continue;
    auto* t = transports_[ti++].get();
    std::vector<std::string> remote;
    for (int p : peers_of[i]) remote.push_back(unpack(addr[p]).at(rank_));
    t->connect(peers_of[i], remote);
    for (int p : peers_of[i]) {
      transport_of_[p] = t;
      pair_of_[p] = t->pair(p);
      HARP_INFO("comm %016llx rank %d -> rank %d (%s): transport %s", (unsigned long long)comm_id_, rank_, p,
                peers_[p].hostname.c_str(), t->name());
    }
  }
  std::string kind;
  for (auto* t : transport_of_) {
    if (!t) continue;
    if (kind.empty()) kind = t->name();
    else if (kind != t->name()) kind = "mixed";
  }
  if (!kind.empty()) transport_kind_ = kind;
  HARP_INFO("comm %016llx ready: rank %d of %d, reduction kernels %s", (unsigned long long)comm_id_, rank_, size_,
            reduceKernelName());
}

Communicator::~Communicator() {
  try {
    destroy();
  } catch (...) {
  }
}

std::string Communicator::transportName(int peer) const {
  if (peer < 0 || peer >= size_) throw InvalidArgument("peer " + std::to_string(peer) + " out of range");
  if (peer == rank_) return "self";
  return transport_of_[peer] ? transport_of_[peer]->name() : "none";
}

// ---------------------------------------------------------------------------
// Validation and algorithm choice

void Communicator::validate(const CollArgs& a) const {
  const char* name = collName(a.coll);
  if (static_cast<unsigned>(a.coll) >= kNumCollTypes) throw InvalidArgument("unknown collective");
  dtypeSize(a.dtype);
  if (a.coll == CollType::kAllreduce || a.coll == CollType::kReduce || a.coll == CollType::kReduceScatter)
    checkOpSupported(a.dtype, a.op);
  bool rooted = a.coll == CollType::kBroadcast || a.coll == CollType::kReduce || a.coll == CollType::kGather ||
                a.coll == CollType::kScatter;
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
  if (a.coll == CollType::kAlltoallv) {
    if (a.sendcounts.size() != (size_t)size_ || a.sdispls.size() != (size_t)size_ ||
        a.recvcounts.size() != (size_t)size_ || a.rdispls.size() != (size_t)size_)
      throw InvalidArgument("alltoallv: counts and displacements need one entry per rank (" + std::to_string(size_) + ")");
  }
  if (a.coll == CollType::kBarrier) return;
  if (a.count > 0 || a.coll == CollType::kAlltoallv) {
    bool needs_send = a.coll != CollType::kRecv && !(a.coll == CollType::kScatter && a.root != rank_) &&
                      a.coll != CollType::kBroadcast;
    bool needs_recv = a.coll != CollType::kSend && !(a.coll == CollType::kReduce && a.root != rank_) &&
                      !(a.coll == CollType::kGather && a.root != rank_);
    if (a.coll == CollType::kBroadcast && !a.recvbuf) throw InvalidArgument("broadcast: buffer is null");
    if (a.coll == CollType::kAlltoallv) {
      size_t s = std::accumulate(a.sendcounts.begin(), a.sendcounts.end(), size_t{0});
      size_t r = std::accumulate(a.recvcounts.begin(), a.recvcounts.end(), size_t{0});
      needs_send = s > 0;
      needs_recv = r > 0;
    }
    if (needs_send && !a.sendbuf) throw InvalidArgument(std::string(name) + ": send buffer is null");
    if (needs_recv && !a.recvbuf) throw InvalidArgument(std::string(name) + ": receive buffer is null");
  }
  if (!a.opts.algo.empty() && !findAlgorithm(a.coll, a.opts.algo))
    throw InvalidArgument(std::string(name) + ": unknown algorithm '" + a.opts.algo + "' (known: " +
                          algorithmList(a.coll) + ")");
}

std::string Communicator::chooseAlgorithm(const CollArgs& a) const {
  if (!a.opts.algo.empty()) return a.opts.algo;
  std::string algo = tuning_.lookup(a.coll, transport_kind_, size_, bytesOf(a));
  if (algo.empty()) throw Error(Error::kInternal, std::string("tuning table has no row for ") + collName(a.coll));
  if (!findAlgorithm(a.coll, algo))
    throw InvalidArgument(std::string("tuning/HARP_ALGO names unknown algorithm '") + algo + "' for " +
                          collName(a.coll) + " (known: " + algorithmList(a.coll) + ")");
  return algo;
}

const Algorithm* Communicator::algorithmFor(const CollArgs& a) {
  const size_t bytes = bytesOf(a);
  const size_t slot = static_cast<size_t>(a.coll);
  const bool memo = a.opts.algo.empty() && slot < std::size(algo_memo_);
  if (memo && algo_memo_[slot].algo && algo_memo_[slot].bytes == bytes) return algo_memo_[slot].algo;
  const std::string name = chooseAlgorithm(a);
  const Algorithm* algo = findAlgorithm(a.coll, name);
  if (logLevel() >= LogLevel::kInfo) {
    std::string key = std::string(collName(a.coll)) + "/" + name;
    if (std::find(logged_algos_.begin(), logged_algos_.end(), key) == logged_algos_.end()) {
      logged_algos_.push_back(key);
      HARP_INFO("%s: algorithm %s (%zu bytes, %d ranks)", collName(a.coll), name.c_str(), bytes, size_);
    }
  }
  if (memo) algo_memo_[slot] = {bytes, algo};
  return algo;
}

// ---------------------------------------------------------------------------
// Execution

std::shared_ptr<Work> Communicator::submit(CollArgs args, bool async) {
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
    if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
    queue_.emplace_back(std::move(args), w);
    ++in_flight_;
  }
  q_cv_.notify_one();
  if (!async) w->wait();
  return w;
}

void Communicator::run(CollArgs args) {
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

void Communicator::runCollective(CollArgs& a) {
  if (broken_.load()) {
    std::lock_guard<std::mutex> g(broken_mu_);
    throw Error(broken_kind_, broken_reason_);
  }
  bool p2p = a.coll == CollType::kSend || a.coll == CollType::kRecv || a.coll == CollType::kP2pBatch;
  uint32_t seq = p2p ? 0 : ++seq_;
  // p2p: both sides must agree on "send" vs "recv" being the same message, so
  // they share one tag kind; the user tag travels in the root field.
  CollType tag_coll = p2p ? CollType::kSend : a.coll;
  int tag_root = p2p ? static_cast<int>(a.tag) : a.root;
  uint64_t tag = makeTag(seq, tag_coll, a.dtype, a.op, tag_root, a.count);
  double timeout = a.opts.timeout_s > 0 ? a.opts.timeout_s : timeout_s_;
  const Algorithm* algo = algorithmFor(a);
  try {
    Context ctx(*this, a, tag, timeout);
    algo->fn(ctx);
  } catch (const Error& e) {
    if (e.kind() != Error::kInvalidArgument) markBroken(e.what());
    throw;
  }
  if (a.op == ReduceOp::kAvg) {
    if (a.coll == CollType::kAllreduce || a.coll == CollType::kReduceScatter ||
        (a.coll == CollType::kReduce && a.root == rank_))
      finalizeAvg(a.recvbuf, a.count, a.dtype, size_);
  }
}

void Communicator::markBroken(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(broken_mu_);
    if (broken_.load()) return;
    broken_reason_ = why;
    broken_kind_ = Error::kPeerFailure;
    if (why.find("mismatch") != std::string::npos) broken_kind_ = Error::kMismatch;
    if (why.find("timed out") != std::string::npos) broken_kind_ = Error::kTimeout;
    broken_.store(true);
  }
  HARP_WARN("communicator broken: %s", why.c_str());
  for (auto& t : transports_) t->abort(why);
}

std::string Communicator::brokenReason() {
  std::lock_guard<std::mutex> g(broken_mu_);
  return broken_reason_;
}

void Communicator::abort(const std::string& reason) {
  markBroken("aborted by rank " + std::to_string(rank_) + ": " + reason);
}

void Communicator::destroy() {
  {
    std::lock_guard<std::mutex> l(q_mu_);
    if (destroyed_) return;
    destroyed_ = true;
    stop_ = true;
  }
  q_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> ex(exec_mu_);
  store_.reset();  // closes a TcpStore connection now (the root may then retire)
  transports_.clear();
  pair_of_.assign(size_, nullptr);
  transport_of_.assign(size_, nullptr);
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
  return create(std::make_shared<PrefixStore>(store_, prefix), new_rank, static_cast<int>(members.size()), o);
}

}  // namespace harp
