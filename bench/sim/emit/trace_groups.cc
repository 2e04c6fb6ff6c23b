// bench/sim/emit/trace_groups.cc — sub-communicators for traced hierarchical
// algorithms (frames.h): a Group (core/algorithms/group.h) whose run() runs
// the leg's algorithm for this rank at once, in a nested Context on the leg's
// frame, recording into the same Schedule.
#include <memory>
#include <optional>
#include <stdexcept>

#include "bench/sim/emit/frames.h"
#include "bench/sim/emit/schedule.h"
#include "core/algorithms/group.h"
#include "core/algorithms/registry.h"
#include "core/engine/resources.h"

namespace harp::sim {
namespace {

struct Layout {
  int p = 1, hosts = 1, local = 1;
  LegPolicy policy;
  std::optional<Frame> next;
  SubComms subs;
  int subs_rank = -1;
} g;

std::string legAlgorithm(CollType c, size_t bytes, int comm) {
  const LegPolicy& pol = g.policy;
  if (c == CollType::kReduce)
    return !pol.intra_reduce.empty() ? pol.intra_reduce : bytes < 256 * 1024 ? "binomial" : "pipeline";
  if (c == CollType::kBroadcast) return !pol.intra_broadcast.empty() ? pol.intra_broadcast : "binomial";
  if (c == CollType::kAllreduce && comm == 2) {
    if (!pol.leaders_allreduce.empty()) return pol.leaders_allreduce;
    return bytes < 16 * 1024 ? "recursive_doubling" : bytes < 2 * 1024 * 1024 ? "halving_doubling" : "ring";
  }
  throw std::invalid_argument("harp_sched: no leg policy for this collective on sub-communicator " +
                              std::to_string(comm));
}

class TraceGroup : public Group {
 public:
  TraceGroup(std::vector<int> ranks, int me, int comm) : ranks_(std::move(ranks)), me_(me), comm_(comm) {}
  int size() const override { return static_cast<int>(ranks_.size()); }
  void run(CollArgs a) override {
    const Algorithm* algo = findAlgorithm(a.coll, legAlgorithm(a.coll, a.count * dtypeSize(a.dtype), comm_));
    if (!algo) throw std::invalid_argument("harp_sched: leg algorithm not linked into harp_sched");
    CommResources res;
    res.segment_bytes = g.policy.segment_bytes;
    setNextFrame({ranks_, comm_});
    Context ctx(res, me_, size(), a, 0, a.opts.timeout_s);
    algo->fn(ctx);
  }
  std::shared_ptr<Work> submit(CollArgs, bool) override {
    throw std::invalid_argument("harp_sched: asynchronous legs (Group::submit) are not traced");
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
