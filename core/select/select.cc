#include "core/select/select.h"

#include "base/env.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace harp {
namespace {
bool isPow2(int n) { return n > 0 && (n & (n - 1)) == 0; }
// Every reduction HARP has is commutative (sum, prod, min, max, avg, band,
// bor, bxor); a future non-commutative op is added here.
bool isCommutative(ReduceOp) { return true; }

std::string list(CollType c) { return algorithmList(c); }

const Algorithm* named(CollType c, std::string_view name, const std::string& who) {
  const Algorithm* a = findAlgorithm(c, name);
  if (!a)
    throw InvalidArgument(who + " names unknown " + collName(c) + " algorithm '" + std::string(name) +
                          "' (known: " + list(c) + ")");
  return a;
}

// Step 5 of core/select/select.h: a hierarchical algorithm replaces the flat pick
// only where the model predicts it faster than the flat pick and than the
// cheapest flat candidate: a table row names the best flat algorithm where it
// was measured, which says nothing about how a hierarchical one compares with
// the other flat ones. Runs only when the query could allow one (several
// hosts, a host with several ranks).
void preferHierarchy(const SelectQuery& q, Selection& s) {
  if (!q.hier_auto || q.hosts < 2 || q.max_local < 2 || s.pick->hier_cost) return;
  const double flat = predictedSeconds(*s.pick, q, s.params);
  double bar = flat;
  if (const Algorithm* c = cheapestFlat(q, s.params)) bar = std::min(bar, predictedSeconds(*c, q, s.params));
  const Algorithm* best = nullptr;
  double best_s = bar;
  for (const Algorithm* a : algorithmsOf(q.coll)) {
    if (!a->hier_cost || !failedRestriction(*a, q).empty()) continue;
    double t = predictedSeconds(*a, q, s.params);
    if (t < best_s) best = a, best_s = t;
  }
  if (!best) return;
  s.hier_over = s.pick;
  s.hier_over_source = s.source;
  s.hier_over_s = flat;
  s.hier_s = best_s;
  s.pick = best;
  s.source = PickSource::kCostModel;
}

[[noreturn]] void nothingFits(const SelectQuery& q, const std::string& start) {
  std::string why;
  for (const Algorithm* a : algorithmsOf(q.coll))
    why += (why.empty() ? "" : "; ") + std::string(a->name) + ": " + failedRestriction(*a, q);
  throw Error(Error::kInternal, std::string("no ") + collName(q.coll) + " algorithm fits " + std::to_string(q.ranks) +
                                    " ranks on " + std::string(q.transport) + start + " (" + why + ")");
}
}  // namespace

const Algorithm* withFallback(const Algorithm* a, const SelectQuery& q) {
  for (int hops = 0; a && hops < 32; ++hops) {
    if (failedRestriction(*a, q).empty()) return a;
    a = a->fallback ? findAlgorithm(a->coll, a->fallback) : nullptr;
  }
  return nullptr;
}

const Algorithm* cheapestFlat(const SelectQuery& q, const TransportParams& t) {
  const Algorithm* best = nullptr;
  double best_s = std::numeric_limits<double>::infinity();
  for (const Algorithm* a : algorithmsOf(q.coll)) {
    if (!failedRestriction(*a, q).empty() || a->hier_cost) continue;  // hierarchy: preferHierarchy
    double s = predictedSeconds(*a, q, t);
    if (!best || s < best_s) best = a, best_s = s;  // ties: the first by name
  }
  return best;
}

std::string failedRestriction(const Algorithm& a, const SelectQuery& q) {
  const Restrictions& r = a.restrictions;
  if (r.transport && q.transport != r.transport)
    return std::string("needs transport ") + r.transport + " for every peer (this communicator: " +
           std::string(q.transport) + ")";
  if (r.pow2_ranks && !isPow2(q.ranks)) return "needs a power-of-two rank count (" + std::to_string(q.ranks) + ")";
  if (q.ranks < r.min_ranks) return "needs at least " + std::to_string(r.min_ranks) + " ranks (" + std::to_string(q.ranks) + ")";
  if (r.max_ranks && q.ranks > r.max_ranks)
    return "needs at most " + std::to_string(r.max_ranks) + " ranks (" + std::to_string(q.ranks) + ")";
  if (r.max_count && q.count > r.max_count)
    return "needs count <= " + std::to_string(r.max_count) + " (" + std::to_string(q.count) + ")";
  if (r.commutative_op && collReduces(q.coll) && !isCommutative(q.op))
    return std::string("needs a commutative op (") + opName(q.op) + ")";
  if (r.in_place == InPlace::kOnly && !q.in_place) return "in-place only (send and receive buffers differ)";
  if (r.in_place == InPlace::kNever && q.in_place) return "out-of-place only (send buffer == receive buffer)";
  if (q.hosts < r.min_hosts)
    return "needs at least " + std::to_string(r.min_hosts) + " hosts (" + std::to_string(q.hosts) + ")";
  if (q.max_local < r.min_local_ranks)
    return "needs a host with at least " + std::to_string(r.min_local_ranks) + " ranks (at most " +
           std::to_string(q.max_local) + " per host)";
  if (r.uniform_hosts && q.min_local != q.max_local)
    return "needs the same rank count on every host (" + std::to_string(q.min_local) + " to " +
           std::to_string(q.max_local) + ")";
  return "";
}

std::string restrictionText(const Restrictions& r) {
  std::string out;
  auto add = [&](const std::string& t) { out += (out.empty() ? "" : "; ") + t; };
  if (r.transport) add(std::string("transport ") + r.transport);
  if (r.pow2_ranks) add("power-of-two ranks");
  if (r.min_ranks > 1) add(">= " + std::to_string(r.min_ranks) + " ranks");
  if (r.max_ranks) add("<= " + std::to_string(r.max_ranks) + " ranks");
  if (r.max_count) add("count <= " + std::to_string(r.max_count));
  if (r.commutative_op) add("commutative op");
  if (r.in_place == InPlace::kOnly) add("in-place only");
  if (r.in_place == InPlace::kNever) add("out-of-place only");
  if (r.min_hosts > 1) add(">= " + std::to_string(r.min_hosts) + " hosts");
  if (r.min_local_ranks > 1) add("a host with >= " + std::to_string(r.min_local_ranks) + " ranks");
  if (r.uniform_hosts) add("equal hosts");
  return out.empty() ? "any" : out;
}

double predictedSeconds(const Algorithm& a, const SelectQuery& q, const TransportParams& t) {
  if (a.hier_cost) {
    HierShape s;
    s.hosts = q.hosts;
    s.local = q.max_local;
    return a.hier_cost(static_cast<double>(q.bytes), s, q.intra, q.inter);
  }
  if (a.flat_hier_cost && q.hosts >= 2 && q.max_local >= 2 && q.min_local == q.max_local && q.blocked)
    return a.flat_hier_cost(static_cast<double>(q.bytes), HierShape{q.hosts, q.max_local}, q.intra, q.inter);
  if (!a.cost) return std::numeric_limits<double>::infinity();
  return a.cost(static_cast<double>(q.bytes), q.ranks, t);
}

const char* pickSourceName(PickSource s) {
  switch (s) {
    case PickSource::kUser: return "user";
    case PickSource::kTuning: return "tuning";
    default: return "cost model";
  }
}

std::string Selection::reason() const {
  std::string out;
  if (hier_over) {
    char b[160];
    snprintf(b, sizeof b, "cost model: hierarchical %s predicted %.3g s < %.3g s of the flat pick %s (%s)", pick->name,
             hier_s, hier_over_s, hier_over->name, pickSourceName(hier_over_source));
    return b;
  }
  if (source == PickSource::kCostModel) {
    out = "cost model: cheapest candidate whose restrictions hold";
    if (!other_line.empty()) {
      char b[160];
      snprintf(b, sizeof b, " (tuning row %s was measured for another line; this one's alpha is %.3g us)",
               other_line.c_str(), params.alpha * 1e6);
      out += b;
    }
  }
  else out = std::string(source == PickSource::kUser ? "user (" : "tuning row ") + why +
             (source == PickSource::kUser ? ")" : "") + " names " + named->name;
  if (!named_failed.empty()) out += ", which " + named_failed + "; declared fallback " + pick->name;
  return out;
}

Selection selectAlgorithm(const SelectQuery& query, const TuningTable& table, const Calibration& cal, bool explain) {
  SelectQuery q = query;
  q.intra = cal.params("shm");
  q.inter = cal.params("tcp");
  Selection s;
  // A call whose flows share the host link with link_flows - 1 others (rail's rails) sees its share.
  s.params = sharedBy(cal.params(std::string(q.transport)), q.link_flows);
  q.inter = sharedBy(q.inter, q.link_flows);
  if (!q.user_algo.empty()) {
    s.source = PickSource::kUser;
    s.why = "algo= argument";
    s.named = named(q.coll, q.user_algo, "algo=");
  } else if (auto m = table.match(q.coll, q.transport, q.ranks, q.bytes, s.params.alpha); m.row) {
    s.source = m.override ? PickSource::kUser : PickSource::kTuning;
    s.why = m.row->where;
    s.named = named(q.coll, m.row->algo, m.override ? "HARP_ALGO" : "tuning row " + m.row->where);
  } else if (m.other_line) {
    s.other_line = m.other_line->where;
  }
  if (s.named) {
    s.pick = withFallback(s.named, q);
    if (s.pick != s.named) s.named_failed = "fails: " + failedRestriction(*s.named, q);
    if (!s.pick) nothingFits(q, " from " + std::string(s.named->name) + " and its fallbacks");
  } else {
    s.pick = cheapestFlat(q, s.params);
    if (!s.pick) nothingFits(q, "");
  }
  if (s.source != PickSource::kUser) preferHierarchy(q, s);
  if (explain) {
    s.params_source = cal.sourceOf(std::string(q.transport));
    for (const Algorithm* a : algorithmsOf(q.coll))
      s.candidates.push_back({a, failedRestriction(*a, q), predictedSeconds(*a, q, s.params)});
  }
  return s;
}

Selection explainAlgorithm(const SelectQuery& query) {
  SelectQuery q = query;
  q.hier_auto = env::flag("HARP_HIER");  // as the communicator reads it
  return selectAlgorithm(q, TuningTable::fromEnvironment(), Calibration::fromEnvironment(), true);
}

}  // namespace harp
