// core/engine/communicator_topology.cc — the Communicator's topology functions:
// confirming which ranks share a host, the host map, and the sub-communicators
// hierarchical algorithms run on. See core/topology/topology.h for the model and
// core/engine/communicator.h ("Topology") for the declarations.
//
// Sub-communicators: intra (this host's ranks) and rail (the i-th rank of
// every host; rail 0 = the leaders) are ordinary communicators made with
// Communicator::create over a PrefixStore of the parent's store, under
// "topo<comm id>/intra<host>/" and "topo<comm id>/rail<i>/": deterministic and
// disjoint, so every group rendezvouses by itself. They are made lazily, by
// the first hierarchical collective, on the thread executing it (the parent's
// execution lock is held; nothing here submits to the parent). Creation order
// is intra, then rail, on every rank: a rail's rendezvous needs every member
// to have finished its host's intra rendezvous first, which every rank of the
// collective does, so no group waits in a cycle. They read the environment
// like any communicator, except HARP_ALGO: a user's override names the
// parent's algorithm (e.g. rail), not the legs'. abort() and markBroken()
// pass the notice on to them, so a rank waiting in a leg learns of a failure
// elsewhere; destroy() destroys them.
#include <cstring>

#include "base/log.h"
#include "core/engine/communicator.h"

namespace harp {

void Communicator::confirmHosts(const std::vector<std::string>& nics) {
  std::vector<std::string> claimed(size_);
  for (int r = 0; r < size_; ++r) claimed[r] = peers_[r].host_id;
  auto confirmed = confirmHostIds(*store_, "topo/", rank_, claimed, timeout_s_);
  for (int r = 0; r < size_; ++r) peers_[r].host_id = confirmed.at(r);
  topo_ = Topology::fromPeers(peers_, nics);
  if (logLevel() >= LogLevel::kInfo && rank_ == 0)
    HARP_INFO("comm %016llx topology: %s", (unsigned long long)comm_id_, topo_.describe().c_str());
}

std::shared_ptr<Communicator> Communicator::subCreate(const std::string& name, int rank, int size) {
  CommOptions o = opts_;
  o.timeout_s = timeout_s_;
  const std::string prefix = "topo" + std::to_string(comm_id_) + "/" + name + "/";
  auto c = create(std::make_shared<PrefixStore>(store_, prefix), rank, size, o);
  c->tuning_.overrides.clear();  // HARP_ALGO names the parent's algorithm, not the legs'
  setLogRank(rank_);             // create() set the log prefix to the sub-communicator's rank
  return c;
}

SubComms& Communicator::subComms() {
  if (subs_) return *subs_;
  auto s = std::make_unique<SubComms>();
  s->host = topo_.host_of.at(rank_);
  s->local_rank = topo_.local_rank_of.at(rank_);
  s->topo = &topo_;
  const auto& mine = topo_.ranks_of.at(s->host);
  if (mine.size() > 1)
    s->intra = subCreate("intra" + std::to_string(s->host), s->local_rank, static_cast<int>(mine.size()));
  const auto rail = topo_.rail(s->local_rank);
  if (rail.size() > 1) {
    int pos = 0;
    while (rail[pos] != rank_) ++pos;
    s->rail = subCreate("rail" + std::to_string(s->local_rank), pos, static_cast<int>(rail.size()));
  }
  HARP_INFO("comm %016llx: sub-communicators made (host %d, local rank %d: intra %d ranks, rail %d ranks)",
            (unsigned long long)comm_id_, s->host, s->local_rank, s->intra ? s->intra->size() : 1,
            s->rail ? s->rail->size() : 1);
  std::lock_guard<std::mutex> g(subs_mu_);
  subs_ = std::move(s);
  return *subs_;
}

void Communicator::abortSubComms(const std::string& notice) {
  std::lock_guard<std::mutex> g(subs_mu_);
  if (!subs_) return;
  for (auto* c : {subs_->intra.get(), subs_->rail.get()})
    if (c && !c->broken()) c->abort("parent communicator broken: " + notice);
}

void Communicator::destroySubComms() {
  std::unique_ptr<SubComms> s;
  {
    std::lock_guard<std::mutex> g(subs_mu_);
    s = std::move(subs_);
  }
  if (!s) return;
  if (s->rail) s->rail->destroy();
  if (s->intra) s->intra->destroy();
}

}  // namespace harp
