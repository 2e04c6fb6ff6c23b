// core/algorithms/hier.cc — hier::legSeconds (core/algorithms/hier.h): the cost
// model's time of a hierarchical algorithm's leg, as the leg's own selector
// would run it.
#include "core/algorithms/hier.h"

#include <algorithm>
#include <limits>

#include "core/algorithms/registry.h"
#include "core/select/select.h"
#include "core/select/tuning.h"

namespace harp::hier {

double legSeconds(CollType coll, double bytes, int ranks, const char* transport, const TransportParams& t) {
  if (ranks <= 1) return 0;
  SelectQuery q;
  q.coll = coll;
  q.bytes = static_cast<size_t>(bytes);
  q.count = q.bytes / 4;
  q.ranks = ranks;
  q.transport = transport;
  if (auto m = TuningTable::builtin().match(coll, transport, ranks, q.bytes, t.alpha); m.row) {
    const Algorithm* a = findAlgorithm(coll, m.row->algo);
    for (int hops = 0; a && hops < 32 && !failedRestriction(*a, q).empty(); ++hops)
      a = a->fallback ? findAlgorithm(coll, a->fallback) : nullptr;
    if (a && a->cost && !a->hier_cost) return a->cost(bytes, ranks, t);
  }
  double best = std::numeric_limits<double>::infinity();
  for (const Algorithm* a : algorithmsOf(coll)) {
    if (a->hier_cost || !a->cost || !failedRestriction(*a, q).empty()) continue;
    best = std::min(best, a->cost(bytes, ranks, t));
  }
  return best;
}

}  // namespace harp::hier
