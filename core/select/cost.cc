#include "core/select/cost.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "base/env.h"
#include "base/reduce.h"

namespace harp {
namespace {
// Measured with scripts/calibrate.py on the development VM; see docs/algorithms.md
// ("Transport parameters") for the run, its load and how to redo it.
const char* const kBuiltinCalibration =
    "tcp 15e-6 4.2e-10 1.0e-10\n"
    "shm 0.7e-6 1.1e-10 1.0e-10\n";

double parseValue(const std::string& s, const std::string& where, const char* what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !std::isfinite(v) || v < 0)
    throw InvalidArgument(where + ": " + what + " '" + s + "' is not a finite number >= 0");
  return v;
}
}  // namespace

Calibration Calibration::builtin() {
  Calibration c;
  c.parse(kBuiltinCalibration, "built in");
  for (auto& l : c.lines_) l.source = "built in";
  return c;
}

Calibration Calibration::fromEnvironment() {
  Calibration c = builtin();
  const std::string file = env::str("HARP_CALIBRATION_FILE");
  if (file.empty()) return c;
  std::ifstream f(file);
  if (!f) throw InvalidArgument("HARP_CALIBRATION_FILE='" + file + "' cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  c.parse(ss.str(), file);
  return c;
}

void Calibration::parse(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream f(line);
    std::string t, a, b, g, o, lb, extra;
    if (!(f >> t)) continue;
    const std::string where = source + ":" + std::to_string(n);
    if (!(f >> a >> b >> g) || ((f >> o) && (f >> lb) && (f >> extra)))
      throw InvalidArgument(where + ": expected 4 to 6 columns: transport alpha_s beta_s_per_byte gamma_s_per_byte"
                                    " [overhead_s [link_beta_s_per_byte]]");
    Line l{t, {parseValue(a, where, "alpha"), parseValue(b, where, "beta"), parseValue(g, where, "gamma")}, where};
    auto it = std::find_if(lines_.begin(), lines_.end(), [&](const Line& x) { return x.transport == t; });
    // The per-message overhead: the fifth column; else the line this one
    // replaces keeps its software figure (a calibrated long line has the
    // loopback's overhead and its own alpha); else, a line of its own, alpha.
    l.params.overhead = !o.empty() ? parseValue(o, where, "overhead")
                        : it != lines_.end() ? it->params.overhead : l.params.alpha;
    if (!lb.empty()) l.params.link_beta = parseValue(lb, where, "link_beta");
    if (it != lines_.end()) *it = l;
    else lines_.push_back(l);
  }
}

const Calibration::Line* Calibration::find(const std::string& transport) const {
  for (const auto& l : lines_)
    if (l.transport == transport) return &l;
  return nullptr;
}

TransportParams Calibration::params(const std::string& transport) const {
  if (transport == "mixed") {
    TransportParams m;
    for (const auto& l : lines_) {
      m.alpha = std::max(m.alpha, l.params.alpha);
      m.beta = std::max(m.beta, l.params.beta);
      m.gamma = std::max(m.gamma, l.params.gamma);
      m.overhead = std::max(m.overhead, l.params.overhead);
      m.link_beta = std::max(m.link_beta, l.params.link_beta > 0 ? l.params.link_beta : l.params.beta);
    }
    return m;
  }
  if (const Line* l = find(transport)) return l->params;
  if (const Line* l = find("tcp")) return l->params;
  return {};
}

std::string Calibration::sourceOf(const std::string& transport) const {
  if (transport == "mixed") return "largest of every line";
  if (const Line* l = find(transport)) return l->source;
  if (const Line* l = find("tcp")) return "no line for " + transport + "; tcp's (" + l->source + ")";
  return "none";
}

double measureGamma() {
  const size_t n = (4 << 20) / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), out(n);
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    reduce(out.data(), a.data(), b.data(), n, DataType::kFloat32, ReduceOp::kSum);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);  // the first run faults the pages in
  }
  return best / (n * sizeof(float));
}

}  // namespace harp
