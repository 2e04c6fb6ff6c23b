// bench/sim/emit/trace_groups.cc — sub-communicators for traced hierarchical
// algorithms (frames.h): a Group (core/algorithms/group.h) whose run() runs
// the leg's algorithm for this rank at once, in a nested Context on the leg's
// frame, recording into the same Schedule.
#include <memory>
#include <optional>
#include <unordered_map>
#include <stdexcept>

#include "bench/sim/emit/frames.h"
#include "bench/sim/emit/schedule.h"
#include "core/algorithms/group.h"
#include "core/algorithms/registry.h"
#include "core/engine/resources.h"
#include "core/select/select.h"

namespace harp::sim {
namespace {

struct Layout {
  int p = 1, hosts = 1, local = 1;
  LegPolicy policy;
  std::optional<Frame> next;
  SubComms subs;
  int subs_rank = -1;
  Topology topo;  // the block placement's host map (SubComms::topo)
} g;

std::string legAlgorithm(const CollArgs& a, int comm, int size) {
  const LegPolicy& pol = g.policy;
  if (comm == 1 && a.coll == CollType::kReduce && !pol.intra_reduce.empty()) return pol.intra_reduce;
  if (comm == 1 && a.coll == CollType::kBroadcast && !pol.intra_broadcast.empty()) return pol.intra_broadcast;
  if (comm == 2 && a.coll == CollType::kAllreduce && !pol.leaders_allreduce.empty()) return pol.leaders_allreduce;
  if (!pol.cal || !pol.table) throw std::logic_error("harp_sched: no selector tables for the legs");
  SelectQuery q;
  q.coll = a.coll;
  q.count = a.count;
  q.bytes = a.count * dtypeSize(a.dtype);
  q.ranks = size;
  q.transport = comm == 1 ? "shm" : "tcp";
  q.in_place = a.sendbuf && a.sendbuf == a.recvbuf;
  q.op = a.op;
  q.hosts = comm == 1 ? 1 : size;
  q.min_local = q.max_local = 1;
  if (comm == 1) q.min_local = q.max_local = size;
  q.blocked = true;
  q.link_flows = a.opts.link_flows;
  return selectAlgorithm(q, *pol.table, *pol.cal, false).pick->name;
}

// A submitted leg's Work (Group::submit): the job it ran as; Work::wait joins it.
std::unordered_map<const Work*, int>& jobs() {
  static std::unordered_map<const Work*, int> m;
  return m;
}

class TraceGroup : public Group {
 public:
  TraceGroup(std::vector<int> ranks, int me, int comm) : ranks_(std::move(ranks)), me_(me), comm_(comm) {}
  int size() const override { return static_cast<int>(ranks_.size()); }
  void run(CollArgs a) override {
    const std::string name = legAlgorithm(a, comm_, size());
    const Algorithm* algo = findAlgorithm(a.coll, name);
    if (!algo) throw std::invalid_argument("harp_sched: leg algorithm " + name + " not linked into harp_sched");
    CommResources res;
    res.segment_bytes = g.policy.segment_bytes;
    setNextFrame({ranks_, comm_});
    Context ctx(res, me_, size(), a, 0, a.opts.timeout_s);
    algo->fn(ctx);
  }
  // An asynchronous leg runs on the group's worker thread in HARP: here a job
  // of the rank's lane (schedule.h), recorded now, joined by Work::wait.
  std::shared_ptr<Work> submit(CollArgs a, bool async) override {
    auto w = std::make_shared<Work>();
    if (!async) {
      run(std::move(a));
      return w;
    }
    const int job = current().beginJob();
    run(std::move(a));
    current().endJob();
    jobs()[w.get()] = job;
    return w;
  }
  void abort(const std::string&) override {}
  bool broken() const override { return false; }
  void destroy() override {}

 private:
  std::vector<int> ranks_;
  int me_, comm_;
};

}  // namespace

void setLayout(int p, int hosts, const LegPolicy& policy) {
  if (hosts < 1 || p % hosts != 0)
    throw std::invalid_argument("harp_sched: --hosts " + std::to_string(hosts) + " does not divide p = " +
                                std::to_string(p));
  g.p = p;
  g.hosts = hosts;
  g.local = p / hosts;
  g.policy = policy;
  g.subs_rank = -1;
  Topology t;
  t.size = p;
  t.hosts = hosts;
  t.min_local = t.max_local = p / hosts;
  t.blocked = true;
  t.ranks_of.assign(hosts, {});
  for (int r = 0; r < p; ++r) {
    t.host_of.push_back(r / t.max_local);
    t.local_rank_of.push_back(r % t.max_local);
    t.ranks_of[r / t.max_local].push_back(r);
  }
  g.topo = std::move(t);
}

void setNextFrame(Frame f) { g.next = std::move(f); }

Frame takeNextFrame(int size) {
  if (!g.next || static_cast<int>(g.next->ranks.size()) != size)
    throw std::logic_error("harp_sched: a Context was made without a frame of its size");
  Frame f = std::move(*g.next);
  g.next.reset();
  return f;
}

SubComms& subCommsOf(const Frame& f) {
  if (f.comm != 0) throw std::invalid_argument("harp_sched: a leg asked for sub-communicators of its own");
  const int r = current().rank();
  if (g.subs_rank == r) return g.subs;
  const int h = r / g.local, lr = r % g.local;
  SubComms s;
  s.local_rank = lr;
  s.host = h;
  s.topo = &g.topo;
  std::vector<int> intra, rail;
  for (int i = 0; i < g.local; ++i) intra.push_back(h * g.local + i);
  for (int j = 0; j < g.hosts; ++j) rail.push_back(j * g.local + lr);
  if (g.local > 1) s.intra = std::make_shared<TraceGroup>(intra, lr, 1);
  if (g.hosts > 1) s.rail = std::make_shared<TraceGroup>(rail, h, 2);
  g.subs = std::move(s);
  g.subs_rank = r;
  return g.subs;
}

}  // namespace harp::sim

namespace harp {
// A second definition of Work's waits (core/engine/executor.cc is not linked):
// the job is joined once, at its first wait.
bool Work::wait(double) {
  auto& m = sim::jobs();
  if (auto it = m.find(this); it != m.end()) {
    sim::current().join(it->second);
    m.erase(it);
  }
  return true;
}
bool Work::test() { return true; }
bool Work::failed() { return false; }
std::string Work::error() { return ""; }
}  // namespace harp
