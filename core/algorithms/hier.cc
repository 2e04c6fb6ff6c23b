// core/algorithms/hier.cc — hier::legSeconds (core/algorithms/hier.h): the cost
// model's time of a hierarchical algorithm's leg, as the leg's own selector
// would run it.
#include "core/algorithms/hier.h"

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
  // The selector's own steps 2-4 (core/select/select.h): the row and its fallbacks, else the model.
  const Algorithm* a = nullptr;
  if (auto m = TuningTable::builtin().match(coll, transport, ranks, q.bytes, t.alpha); m.row)
    a = withFallback(findAlgorithm(coll, m.row->algo), q);
  if (!a || !a->cost || a->hier_cost) a = cheapestFlat(q, t);
  // a->cost with the caller's bytes: a leg's share (rail's n / pieces / L) need not be whole.
  return a && a->cost ? a->cost(bytes, ranks, t) : std::numeric_limits<double>::infinity();
}

}  // namespace harp::hier
