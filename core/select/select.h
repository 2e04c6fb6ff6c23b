// core/select/select.h — which algorithm runs: the one function behind both the
// runtime choice (Communicator::algorithmFor) and `harp-config --explain`, so
// the two cannot disagree.
//
// Order (first that speaks wins):
//   1. user:   CollOptions::algo (algo= in Python), then HARP_ALGO rows;
//   2. tuning: the first matching row of core/select/tuning.tsv / HARP_TUNING_FILE
//              (a row that names an alpha range holds only for lines whose
//              calibrated alpha lies in it: rows measured on a short line stay
//              silent on a 1 ms one, and the cost model decides there);
//   3. cost:   the cheapest registered algorithm whose restrictions hold,
//              costs evaluated with the transport's Calibration (core/select/cost.h);
//   4. fallback: an algorithm named by 1 or 2 whose restrictions fail is
//              replaced by its declared fallback (followed until one holds).
//   5. hierarchy: where 2 or 3 picked a flat algorithm and the
//              communicator spans several hosts with several ranks on one,
//              the cheapest applicable hierarchical algorithm (HierCostFn,
//              intra = shm's line, inter = tcp's) replaces it only if the
//              model predicts it faster than that flat pick and than the
//              cheapest flat candidate (a row's pick was measured against
//              flat algorithms only) (HARP_HIER=0: never). The inputs are the host map and the calibration, the
//              same on every rank, so every rank decides alike. The tuning
//              table's flat rows keep deciding among flat algorithms.
//              A flat algorithm that declares flat_hier_cost is costed with
//              it on equal hosts of consecutive ranks (recursive doubling:
//              its first log2 L rounds stay inside a host), in 3 and here.
// A user choice that fails a restriction falls back like a table row (MPICH's
// default, MPIR_CVAR_COLLECTIVE_FALLBACK=silent, and NCCL's for NCCL_ALGO),
// and the communicator logs the reason once at WARN level; --explain shows it.
// Unknown names are errors listing the known ones; a collective where nothing
// fits is an error naming every candidate's failed restriction.
//
// The inputs are the same on every rank (rank count, the collective's
// arguments, the environment's tables), with two exceptions: in-place may
// differ per rank, and the transport kind does when only some ranks share a
// host (those see "mixed", the others "tcp"; the built-in table's rows match
// both alike, and mixed's cost parameters equal tcp's while tcp has the
// largest line). A rank that picks differently anyway is caught by the tag's
// algorithm field as a collective mismatch (at worst a timeout), never as
// wrong data.
//
// Threading: pure functions of their arguments.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/algorithms/algorithm.h"
#include "core/select/cost.h"
#include "core/select/tuning.h"

namespace harp {

struct SelectQuery {
  CollType coll = CollType::kAllreduce;
  size_t bytes = 0;              // count x element size (the tuning table's unit)
  size_t count = 0;              // elements
  int ranks = 1;
  std::string_view transport;    // a transport name, "mixed" or "self"
  bool in_place = false;
  ReduceOp op = ReduceOp::kSum;
  std::string_view user_algo;    // CollOptions::algo; empty: none
  // Topology: the host map, the same on every rank (core/topology/topology.h).
  int hosts = 1;
  int min_local = 1, max_local = 1;  // ranks on the smallest / largest host
  bool blocked = false;              // every host's ranks are consecutive (launchers' block placement)
  bool hier_auto = true;             // HARP_HIER: the selector may pick hierarchical algorithms itself
  // Calls like this one crossing each host's link at once (CollOptions::link_flows): the line's
  // per-flow rate becomes their share of the host link (sharedBy(t, link_flows)).
  int link_flows = 1;
  // Parameters of the legs inside / between hosts for HierCostFn; selectAlgorithm
  // fills them from the calibration (shm's and tcp's lines).
  TransportParams intra, inter;
};

// "" when every restriction of `a` holds for `q`; else the one that fails,
// e.g. "needs transport shm for every peer (this communicator: tcp)".
std::string failedRestriction(const Algorithm& a, const SelectQuery& q);
// The declared restrictions in words ("any", "transport shm; power-of-two ranks").
std::string restrictionText(const Restrictions& r);
// a.cost evaluated for q (infinity when a declares no cost).
double predictedSeconds(const Algorithm& a, const SelectQuery& q, const TransportParams& t);
// `a`, or the first algorithm of its declared fallback chain whose restrictions
// hold for q; nullptr when none does (or a is nullptr).
const Algorithm* withFallback(const Algorithm* a, const SelectQuery& q);
// The cheapest flat (not hierarchical) algorithm of q.coll whose restrictions
// hold, by predictedSeconds with t; ties go to the first by name; nullptr when
// none holds.
const Algorithm* cheapestFlat(const SelectQuery& q, const TransportParams& t);

enum class PickSource { kUser, kTuning, kCostModel };
const char* pickSourceName(PickSource s);  // "user", "tuning", "cost model"

struct Candidate {
  const Algorithm* algo = nullptr;
  std::string failed;   // "" : restrictions hold
  double seconds = 0;   // cost-model prediction
};

struct Selection {
  const Algorithm* pick = nullptr;
  PickSource source = PickSource::kCostModel;
  const Algorithm* named = nullptr;   // what user/tuning named, before any fallback
  std::string named_failed;           // why `named` was replaced ("" : it was not)
  std::string why;                    // "algo= argument", "core/select/tuning.tsv:12", ...
  std::string other_line;             // a row that matched but for its alpha column ("" : none)
  // Filled only when explaining (the runtime path skips the strings).
  std::vector<Candidate> candidates;
  TransportParams params;
  std::string params_source;
  // Topology: the flat pick a hierarchical algorithm replaced
  // (nullptr: none), where that pick came from, and both predictions.
  const Algorithm* hier_over = nullptr;
  PickSource hier_over_source = PickSource::kCostModel;
  double hier_over_s = 0, hier_s = 0;
  // One line: "tuning row core/select/tuning.tsv:12 picks ring", "... fails X; fallback ring".
  std::string reason() const;
};

// Throws InvalidArgument for unknown names, Error(kInternal) when nothing fits.
Selection selectAlgorithm(const SelectQuery& q, const TuningTable& table, const Calibration& cal, bool explain);
// The same with the tables a communicator created now would read (HARP_ALGO,
// HARP_TUNING_FILE, HARP_CALIBRATION_FILE): `harp-config --explain`.
Selection explainAlgorithm(const SelectQuery& q);

}  // namespace harp
