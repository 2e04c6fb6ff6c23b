// core/engine/communicator_ft.cc — fault tolerance: the keep-alive, revoke,
// agree, shrink and grow of core/engine/communicator.h ("Fault tolerance" block).
//
// Recovery runs through the bootstrap store, never through the (possibly
// broken) transports, so it works on a revoked communicator and while peers
// are dead or frozen. Keys live under "ft<comm id>.<call><n>/" of the
// communicator's store prefix; every survivor makes the same sequence of
// agree/shrink/grow calls, so their counters (n) match.
//
// agree(): each rank publishes its vote (flag and the ranks its keep-alive
// found failed) and raises a counter "has/<rank>"; it then polls (every 10 ms,
// a few store round trips each) until every rank is either voted or known
// failed (its own keep-alive, or any vote that names it). The first rank to
// get there takes the proposer ticket (an atomic add) and writes the decision
// — the AND of the counted flags and the failed set — which every other rank
// reads. A rank that dies during agree() is counted failed once some
// survivor's keep-alive reports it (HARP_KEEPALIVE_TIMEOUT). Only add/set/get
// are used, so torch's own store (python/harp/torch) serves as well.
#include <chrono>
#include <sstream>
#include <thread>

#include "base/env.h"
#include "base/log.h"
#include "bootstrap/rendezvous.h"
#include "core/engine/communicator.h"
#include "core/ft/keepalive.h"

namespace harp {
namespace {

std::string encodeVote(bool flag, const std::vector<int>& failed) {
  std::string s = flag ? "1|" : "0|";
  for (size_t i = 0; i < failed.size(); ++i) s += (i ? "," : "") + std::to_string(failed[i]);
  return s;
}

// Ranks outside [0, size) and malformed text are ignored (the store is
// authenticated; this only guards against a bug elsewhere).
bool decodeVote(const std::string& s, int size, std::vector<char>* failed) {
  bool flag = !s.empty() && s[0] == '1';
  size_t bar = s.find('|');
  if (bar == std::string::npos) return flag;
  std::stringstream in(s.substr(bar + 1));
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) continue;
    int r = std::stoi(item);
    if (r < size) (*failed)[r] = 1;
  }
  return flag;
}

std::string rankList(const std::vector<int>& v) {
  std::string s;
  for (int r : v) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

std::string Communicator::ftPrefix(const char* what, uint32_t seq) const {
  char id[20];
  snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(comm_id_));
  return std::string("ft") + id + "." + what + std::to_string(seq) + "/";
}

// Every rank publishes its heartbeat address ("" when HARP_KEEPALIVE=0, so
// mixed settings never report a rank without a keep-alive as dead).
void Communicator::startKeepAlive() {
  if (size_ < 2) return;
  const bool on = env::flag("HARP_KEEPALIVE");
  if (on) {
    std::string host = commInfo().bind_hint;
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    keepalive_ = std::make_unique<KeepAlive>(rank_, size_, comm_id_, token_, env::timeout("HARP_KEEPALIVE_INTERVAL"),
                                             env::timeout("HARP_KEEPALIVE_TIMEOUT"), host);
  }
  auto addrs = storeAllgather(*store_, "keepalive", rank_, size_, on ? keepalive_->localAddress() : "", timeout_s_);
  if (!on) return;
  auto describe = [this](int r) {
    return "rank " + std::to_string(r) + " (pid " + std::to_string(peers_[r].pid) + " on " + peers_[r].hostname + ")";
  };
  // Lazy sends (the deferred descriptor check's) left held by a rank that went
  // idle go out within an interval. Transport::flush may run on any thread;
  // destroy() stops this thread before the transports go.
  keepalive_->onBeat([this] {
    for (auto& t : res_.transports) t->flush();
  });
  keepalive_->start(addrs, describe, [this](const std::vector<int>&, const std::string& why) { markBroken(why); });
}

void Communicator::stopKeepAlive() {
  if (keepalive_) keepalive_->stop();
}

// A lost peer's error names the peer at the other end of the failed
// connection, which may be a survivor that aborted (its notice lost behind a
// partial frame, or cut short: shm keeps ~180 bytes of it) rather than the
// rank that died. On that error path only, ask the keep-alive to probe now (a
// killed rank's closed port answers at once), wait (at most one keep-alive
// timeout and two intervals) for its verdict and return the sentence naming
// the dead rank(s), or "".
std::string Communicator::keepAliveVerdict(const std::string& failure) {
  if (!keepalive_) return "";
  // Already named by a keep-alive, or not a lost peer: a user's abort, a mismatch, a timeout.
  for (const char* known : {"dead or unreachable", "aborted by rank", "collective mismatch", "timed out"})
    if (failure.find(known) != std::string::npos) return "";
  const Deadline dl = Deadline::after(keepalive_->timeout() + 2 * env::timeout("HARP_KEEPALIVE_INTERVAL"));
  keepalive_->probeNow();  // a killed peer's closed port answers within a round trip
  for (;;) {
    std::vector<int> dead = keepalive_->failed();
    if (!dead.empty()) {
      std::string who;
      for (int r : dead)
        who += (who.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " (pid " + std::to_string(peers_[r].pid) +
                                            " on " + peers_[r].hostname + ")");
      return "the keep-alive found " + who + " dead or unreachable";
    }
    if (dl.passed()) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Communicator::revoke() {
  refuseIfInherited("revoke");
  markBroken(std::string(kRevokedMark) + std::to_string(rank_));
}

bool Communicator::revoked() {
  std::lock_guard<std::mutex> g(broken_mu_);
  return broken_.load() && broken_kind_ == Error::kRevoked;
}

std::vector<int> Communicator::failedRanks() const { return keepalive_ ? keepalive_->failed() : std::vector<int>{}; }

Communicator::Agreement Communicator::agree(bool flag) {
  refuseIfInherited("agree");
  if (destroyed_ || !store_) throw InvalidArgument("agree: the communicator has been destroyed");
  Store& st = *store_;
  const std::string pre = ftPrefix("agree", ++agree_seq_);
  std::vector<char> failed(size_, 0), voted(size_, 0), flags(size_, 1);
  auto learn = [&](const std::vector<int>& v) {
    for (int r : v) failed[r] = 1;
  };
  learn(failedRanks());
  st.set(pre + "vote/" + std::to_string(rank_), encodeVote(flag, failedRanks()));
  st.add(pre + "has/" + std::to_string(rank_), 1);
  voted[rank_] = 1;
  flags[rank_] = flag;
  const Deadline dl = Deadline::after(timeout_s_);
  for (;;) {
    if (st.add(pre + "decided", 0) > 0) break;
    learn(failedRanks());
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (voted[r] || failed[r]) continue;
      if (st.add(pre + "has/" + std::to_string(r), 0) > 0) {
        voted[r] = 1;
        flags[r] = decodeVote(st.get(pre + "vote/" + std::to_string(r), timeout_s_), size_, &failed);
      } else {
        missing.push_back(r);
      }
    }
    if (missing.empty() && st.add(pre + "proposer", 1) == 1) {
      bool all = true;
      std::vector<int> out;
      for (int r = 0; r < size_; ++r) {
        if (failed[r]) out.push_back(r);
        else all = all && flags[r];
      }
      st.set(pre + "decision", encodeVote(all, out));
      st.add(pre + "decided", 1);
      break;
    }
    if (dl.passed())
      throw Error(Error::kTimeout, "agree on rank " + std::to_string(rank_) + " timed out after " +
                                       formatSeconds(timeout_s_) + " s waiting for rank(s) " + rankList(missing) +
                                       " (alive by the keep-alive, but not calling agree)");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<char> agreed(size_, 0);
  Agreement a;
  a.flag = decodeVote(st.get(pre + "decision", timeout_s_), size_, &agreed);
  for (int r = 0; r < size_; ++r)
    if (agreed[r]) a.failed.push_back(r);
  HARP_INFO("agree #%u on rank %d: flag %d, failed {%s}", agree_seq_, rank_, a.flag ? 1 : 0,
            rankList(a.failed).c_str());
  return a;
}

std::shared_ptr<Communicator> Communicator::shrink(const std::vector<int>* exclude) {
  refuseIfInherited("shrink");
  if (destroyed_ || !store_) throw InvalidArgument("shrink: the communicator has been destroyed");
  std::vector<int> ex = exclude ? *exclude : agree(true).failed;
  std::vector<char> out(size_, 0);
  for (int r : ex) {
    if (r < 0 || r >= size_)
      throw InvalidArgument("shrink: excluded rank " + std::to_string(r) + " is out of range [0, " +
                            std::to_string(size_) + ")");
    out[r] = 1;
  }
  if (out[rank_])
    throw InvalidArgument("shrink: rank " + std::to_string(rank_) + " is in the excluded set {" + rankList(ex) +
                          "}; excluded ranks do not call shrink");
  int new_rank = 0, new_size = 0;
  for (int r = 0; r < size_; ++r) {
    if (out[r]) continue;
    if (r < rank_) ++new_rank;
    ++new_size;
  }
  CommOptions o = opts_;
  o.timeout_s = timeout_s_;
  auto store = std::make_shared<PrefixStore>(store_, ftPrefix("shrink", ++shrink_seq_));
  HARP_INFO("shrink on rank %d: excluding {%s}, new rank %d of %d", rank_, rankList(ex).c_str(), new_rank, new_size);
  return create(store, new_rank, new_size, o);
}

std::shared_ptr<Communicator> Communicator::grow(int new_size, const UniqueId* id) {
  refuseIfInherited("grow");
  if (destroyed_ || !store_) throw InvalidArgument("grow: the communicator has been destroyed");
  if (new_size <= size_)
    throw InvalidArgument("grow: the new size " + std::to_string(new_size) + " must exceed the current size " +
                          std::to_string(size_));
  const std::string key = ftPrefix("grow", ++grow_seq_) + "id";
  UniqueId uid;
  if (rank_ == 0) {
    if (!id) throw InvalidArgument("grow: rank 0 must pass the new unique id (newUniqueId / ncclCommGetUniqueId)");
    uid = *id;
    store_->set(key, uid.hex());
  } else {
    uid = id ? *id : UniqueId::fromHex(rendezvousGet(*store_, key, timeout_s_));
  }
  CommOptions o = opts_;
  o.timeout_s = timeout_s_;
  return create(uid, rank_, new_size, o);
}

UniqueId Communicator::newUniqueId() { return createUniqueId(); }

}  // namespace harp
