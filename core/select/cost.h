// core/select/cost.h — transport parameters for the alpha-beta-gamma cost model.
//
// Each algorithm declares its cost as a function of (n bytes, p ranks,
// TransportParams{alpha, beta, gamma}) (core/algorithms/registry.h); the
// selector (core/select/select.h) evaluates those functions with the parameters of
// the communicator's transport and picks the cheapest algorithm whose
// restrictions hold, where the tuning table is silent.
//
// Built-in parameters (kBuiltinCalibration in cost.cc) were measured on the
// development VM (2 vCPUs, shared; scripts/calibrate.py, figures and load in
// docs/algorithms.md). Transports without a line (verbs, dpdk, future ones)
// use tcp's line until calibrated; "mixed" (several transports in one
// communicator) uses, field by field, the largest value of all lines, so it is
// never optimistic.
//
// HARP_CALIBRATION_FILE=path replaces lines of the built-in set. Format, one
// transport per line, '#' starts a comment:
//     # transport  alpha_s  beta_s_per_byte  gamma_s_per_byte  [overhead_s [link_beta_s_per_byte]]
//     tcp          15e-6    4.2e-10          1.0e-10
// overhead_s (TransportParams::overhead: what each further message of a burst
// posted at once adds) is optional: a line that replaces another keeps that
// line's overhead, so a long line calibrated by scripts/calibrate.py (alpha =
// half its round trip) keeps the built-in software figure; a new transport's
// line without it has overhead = alpha.
// link_beta_s_per_byte (TransportParams::link_beta, optional, after overhead_s):
// a host link's rate for all its flows together, where a line caps each flow
// below it (a cloud VPC's per-flow limit: 10 Gbit/s per flow on a 25 Gbit/s
// NIC); the host-aware costs give L ranks crossing at once the larger of one
// flow's time and the link's. Absent or 0: beta (one flow fills the link).
// Produce one with `python3 scripts/calibrate.py > file` on the target machines.
// Malformed lines, negative or non-finite values are errors naming file:line.
//
// Threading: a Calibration is immutable after construction.
#pragma once

#include <string>
#include <vector>

#include "core/algorithms/algorithm.h"

namespace harp {

class Calibration {
 public:
  struct Line {
    std::string transport;
    TransportParams params;
    std::string source;  // "built in" or "FILE:LINE"
  };
  // The built-in lines, then HARP_CALIBRATION_FILE's (read now; not cached).
  static Calibration fromEnvironment();
  static Calibration builtin();
  // Adds or replaces lines from `text` (errors name `source`:line).
  void parse(const std::string& text, const std::string& source);
  // Parameters for a transport name, "mixed" or anything else (see above).
  TransportParams params(const std::string& transport) const;
  // Where params(transport) comes from, for --explain.
  std::string sourceOf(const std::string& transport) const;
  const std::vector<Line>& lines() const { return lines_; }

 private:
  const Line* find(const std::string& transport) const;
  std::vector<Line> lines_;
};

// Time per byte of this process's float32 sum kernel (4 MiB, best of 5): the
// gamma of scripts/calibrate.py.
double measureGamma();

}  // namespace harp
