// core/select/tuning.h — algorithm choice as data (UCC-style score map, first match wins).
//
// Rows come from core/select/tuning.tsv (built in), or HARP_TUNING_FILE; a row may
// name the line it holds for (a sixth column, the calibration's alpha: "0-100us"). HARP_ALGO is a
// one-line override with the same keys, e.g.
//   HARP_ALGO=ring                                  (allreduce, any size)
//   HARP_ALGO=allreduce:ring,broadcast:binomial
//   HARP_ALGO=allreduce:0-64K:recursive_doubling,allreduce:64K-:ring
// A per-call CollOptions::algo beats both. Unknown names fail with the list of
// known ones. Thread-safe after the first call (tables parsed once).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

namespace harp {

struct TuningRow {
  CollType coll;
  std::string transport;  // "*" = any
  int min_ranks = 1, max_ranks = 1 << 30;
  size_t min_bytes = 0, max_bytes = SIZE_MAX;  // [min, max)
  // The line's alpha (the calibration's per-message latency, half a round trip) the row was
  // measured for, seconds, [min, max): a row measured on a short line says nothing about a
  // long one (1 ms RTT between zones), where the cost model decides instead.
  double min_alpha_s = 0, max_alpha_s = 1e300;
  std::string algo;
  std::string where;  // "core/select/tuning.tsv:12", "FILE:3" or "HARP_ALGO 'allreduce:ring'"
};

std::vector<TuningRow> parseTuning(const std::string& text, const std::string& source);
// HARP_ALGO syntax; rows it yields match any transport and rank count.
std::vector<TuningRow> parseAlgoOverride(const std::string& spec);

// The table a communicator uses: HARP_ALGO rows first, then HARP_TUNING_FILE or
// the built-in table. Read when the communicator is created (not cached per
// process), so each communicator sees the environment of its creation.
struct TuningTable {
  std::vector<TuningRow> overrides, rows;
  static TuningTable fromEnvironment();
  // core/select/tuning.tsv alone (no HARP_TUNING_FILE, no HARP_ALGO), parsed once; for the cost
  // model's legs (hier::legSeconds). Thread-safe (a function-local static).
  static const TuningTable& builtin();
  // The first matching row (HARP_ALGO rows first; `override` says which list);
  // row == nullptr when none matches.
  struct Match {
    const TuningRow* row = nullptr;
    bool override = false;
    const TuningRow* other_line = nullptr;  // the first row that matched all but the alpha column
  };
  // alpha_s: the calibration's alpha for this transport (Calibration::params).
  Match match(CollType c, std::string_view transport, int ranks, size_t bytes, double alpha_s = 0) const;
  // The algorithm for this collective; "" if no row matches.
  std::string lookup(CollType c, const std::string& transport, int ranks, size_t bytes) const;
};

}  // namespace harp
