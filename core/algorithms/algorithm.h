// core/algorithms/algorithm.h — what an algorithm declares about itself, and
// the registry's lookups (without the Context API, so core/select/cost.h,
// core/select/select.h and core/engine/communicator.h can include it). Algorithm files
// include core/algorithms/registry.h, which has the whole story.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

namespace harp {

class Context;
using AlgorithmFn = void (*)(Context&);

// Measured properties of one transport (core/select/cost.h): per-message latency
// alpha (s), per-byte transfer time beta (s/byte), per-byte reduction time
// gamma (s/byte), and overhead (s): what each further message of a burst
// posted at once adds (the sender's and receiver's software cost per message;
// its latency overlaps the first's). On a line without latency of its own
// (loopback) overhead equals alpha; on a long line alpha is half the round
// trip and overhead stays the software figure. 0 means "as alpha".
struct TransportParams {
  double alpha = 0, beta = 0, gamma = 0, overhead = 0;
  // Seconds per byte of a host's link for all its flows together; 0: beta (one flow fills the
  // link). Where a line caps each flow below the link rate (a VPC's per-flow limit), beta is one
  // flow's rate and link_beta the NIC's: L ranks of a host crossing at once share link_beta.
  double link_beta = 0;
};

// HARP_SEGMENT_BYTES' default (base/params.def): the segment the cost functions assume, since
// the model does not read the environment (the algorithms themselves use ctx.segmentBytes()).
inline constexpr size_t kDefaultSegmentBytes = 512 * 1024;

// Seconds for `flows` flows of `bytes` each, at once, through one host's link: no flow beats
// its own rate (beta), and together they get the link's (link_beta).
inline double sharedLinkSeconds(const TransportParams& t, double bytes, double flows) {
  const double link = t.link_beta > 0 ? t.link_beta : t.beta;
  return bytes * (t.beta > flows * link ? t.beta : flows * link);
}

// The line as one of `flows` flows crossing the host's link at once sees it: each gets its
// share of the link (no more than one flow's rate), and has the link to itself at that rate.
inline TransportParams sharedBy(TransportParams t, int flows) {
  if (flows > 1) {
    t.beta = sharedLinkSeconds(t, 1, flows);
    t.link_beta = 0;
  }
  return t;
}

// What each further message of a burst adds: overhead, at most alpha (0: alpha).
inline double messageOverhead(const TransportParams& t) {
  return t.overhead > 0 && t.overhead < t.alpha ? t.overhead : t.alpha;
}

// Seconds until the last of `msgs` messages posted together has started to
// arrive: one latency, then each further message's overhead.
inline double burstLatency(const TransportParams& t, int msgs) {
  return msgs <= 0 ? 0 : t.alpha + (msgs - 1) * messageOverhead(t);
}

// Seconds until `msgs` messages posted together have arrived, where one takes `one_s` to
// transfer and all of them `all_s` through the busiest link: each moves as soon as it is
// posted, so the posting (each further message's overhead) and the transfers overlap:
// one latency, then the later of the last message's post plus its own transfer, and all of
// them through the link.
inline double burstSeconds(const TransportParams& t, int msgs, double one_s, double all_s) {
  if (msgs <= 0) return 0;
  const double posted = burstLatency(t, msgs) + one_s, through = t.alpha + all_s;
  return posted > through ? posted : through;
}

// Predicted seconds for n bytes (as in the tuning table: count x element size,
// per rank where the collective is per rank) on p ranks.
using CostFn = double (*)(double n, int p, const TransportParams& t);

// Hierarchical algorithms are costed with the shape of the
// communicator and two parameter sets: `intra` for the legs inside a host
// (shm's calibration line) and `inter` for the legs between hosts (tcp's).
// hosts: host count; local: ranks on the largest host. One NIC per host is
// assumed: legs running concurrently on one host share its link.
struct HierShape {
  int hosts = 1, local = 1;
};
using HierCostFn = double (*)(double n, const HierShape& s, const TransportParams& intra, const TransportParams& inter);

enum class InPlace : uint8_t { kAny, kOnly, kNever };

// When an algorithm may run. The selector (core/select/select.cc) checks every field
// and names the first that fails ("power-of-two ranks", "transport shm", ...).
struct Restrictions {
  bool pow2_ranks = false;        // rank count a power of two
  bool commutative_op = false;    // reduction op commutative (every HARP op is today)
  InPlace in_place = InPlace::kAny;
  const char* transport = nullptr;  // every peer on this transport (nullptr: any)
  int min_ranks = 1;
  int max_ranks = 0;              // 0: no limit
  size_t max_count = 0;           // elements; 0: no limit
  // Topology, from the communicator's host map (core/topology/topology.h).
  int min_hosts = 1;              // hosts at least
  int min_local_ranks = 1;        // ranks on the largest host at least
  bool uniform_hosts = false;     // every host has the same number of ranks
};

// Rooted collectives: the descriptor messages this algorithm's data makes
// redundant (core/engine/context.h, CheckShape; chosen in core/engine/communicator.cc,
// checkShape). kFull, the default and always safe: every rank sends every rank
// its descriptor. kFromRoot (broadcast, scatter): every rank's data comes from
// the root, forwarded only by ranks that received it with a matching tag.
// kToRoot (gather): every non-root sends its data straight to the root (a tree
// that forwards through inner ranks must keep kFull: an inner rank could wait
// for a child with another idea of the root while the root hears from no one).
enum class RootCheck : uint8_t { kFull, kFromRoot, kToRoot };

struct AlgorithmSpec {
  CollType coll = CollType::kAllreduce;
  const char* name = nullptr;
  AlgorithmFn fn = nullptr;
  Restrictions restrictions = {};
  CostFn cost = nullptr;  // nullptr: never picked by the cost model
  const char* fallback = nullptr;  // same collective; used when a restriction fails
  HierCostFn hier_cost = nullptr;  // hierarchical algorithms: used instead of `cost`
  // A flat algorithm whose rounds fall on hosts in a known way: its cost on hosts of equal,
  // block-placed ranks (intra rounds on the intra line, inter rounds on the inter line with a
  // host's ranks sharing its uplink). nullptr: `cost` with the communicator's line for every round.
  HierCostFn flat_hier_cost = nullptr;
  RootCheck root_check = RootCheck::kFull;  // rooted collectives only (above)
};

struct Algorithm : AlgorithmSpec {
  unsigned index = 0;  // position by name within the collective (tag and descriptor)
};

// Adds `spec` to the registry (called by HARP_REGISTER_ALGORITHM).
struct AlgorithmRegistrar {
  explicit AlgorithmRegistrar(const AlgorithmSpec& spec);
};
#define HARP_ALGO_CONCAT2(a, b) a##b
#define HARP_ALGO_CONCAT(a, b) HARP_ALGO_CONCAT2(a, b)
#define HARP_REGISTER_ALGORITHM(...)                                                  \
  static const ::harp::AlgorithmRegistrar HARP_ALGO_CONCAT(harp_algorithm_, __COUNTER__)( \
      ::harp::AlgorithmSpec __VA_ARGS__)

// Lookups (stable pointers; valid for the life of the process).
const Algorithm* findAlgorithm(CollType c, std::string_view name);
std::vector<const Algorithm*> algorithmsOf(CollType c);  // sorted by name = by index
std::string algorithmList(CollType c);  // "halving_doubling, recursive_doubling, ring, shm"
// Problems found in the registry as a whole ("" when none): duplicate names,
// fallbacks naming unknown algorithms or cycles, more than 16 algorithms of one
// collective, a collective without an unrestricted algorithm. Tests check it.
std::string registryProblems();

}  // namespace harp
