#include "core/select/tuning.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/env.h"

namespace harp {
extern const char* const kBuiltinTuningTable;

namespace {
void parseRange(const std::string& s, size_t& lo, size_t& hi, const std::string& where) {
  if (s == "*") return;
  auto dash = s.find('-');
  if (dash == std::string::npos) {
    lo = env::parseBytes(s, where.c_str());
    hi = lo + 1;
    return;
  }
  std::string a = s.substr(0, dash), b = s.substr(dash + 1);
  lo = a.empty() ? 0 : env::parseBytes(a, where.c_str());
  hi = b.empty() ? SIZE_MAX : env::parseBytes(b, where.c_str());
}

// A time with a unit (ns, us, ms, s), or 0: a bound of the alpha column, in seconds.
double parseSeconds(const std::string& s, const std::string& where) {
  if (s == "0") return 0;  // zero needs no unit
  static const struct { const char* unit; double scale; } kUnits[] = {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3},
                                                                       {"s", 1.0}};
  for (const auto& u : kUnits) {
    size_t n = strlen(u.unit);
    if (s.size() > n && s.compare(s.size() - n, n, u.unit) == 0) {
      std::string num = s.substr(0, s.size() - n);
      if (num.find_first_not_of("0123456789.") != std::string::npos || num.find_first_of("0123456789") ==
          std::string::npos)
        break;
      char* end = nullptr;
      double v = strtod(num.c_str(), &end);
      if (end && *end == 0 && v >= 0 && v < 1e6) return v * u.scale;
      break;
    }
  }
  throw InvalidArgument(where + ": alpha '" + s + "' is not a time with a unit (ns, us, ms, s), e.g. 100us");
}

void parseAlphaRange(const std::string& s, double& lo, double& hi, const std::string& where) {
  if (s == "*") return;
  auto dash = s.find('-');
  if (dash == std::string::npos)
    throw InvalidArgument(where + ": alpha '" + s + "' must be a range: A-B, A- or -B (e.g. 0-100us)");
  std::string a = s.substr(0, dash), b = s.substr(dash + 1);
  if (a.empty() && b.empty()) throw InvalidArgument(where + ": alpha '-' names no bound");
  if (!a.empty()) lo = parseSeconds(a, where);
  if (!b.empty()) hi = parseSeconds(b, where);
  if (lo >= hi) throw InvalidArgument(where + ": alpha range '" + s + "' is empty");
}

void parseRanks(const std::string& s, int& lo, int& hi, const std::string& where) {
  if (s == "*") return;
  size_t a = 0, b = 0;
  parseRange(s, a, b, where);
  lo = static_cast<int>(a);
  if (s.find('-') == std::string::npos) hi = lo;
  else hi = b == SIZE_MAX ? (1 << 30) : static_cast<int>(b);
}
}  // namespace

std::vector<TuningRow> parseTuning(const std::string& text, const std::string& source) {
  std::vector<TuningRow> rows;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream f(line);
    std::string coll, transport, ranks, bytes, algo, alpha, extra;
    if (!(f >> coll)) continue;
    std::string where = source + ":" + std::to_string(n);
    if (!(f >> transport >> ranks >> bytes >> algo) || ((f >> alpha) && (f >> extra)))
      throw InvalidArgument(where + ": expected 5 or 6 columns: collective transport ranks bytes algorithm [alpha]");
    TuningRow r;
    r.coll = parseColl(coll);
    r.transport = transport;
    parseRanks(ranks, r.min_ranks, r.max_ranks, where);
    parseRange(bytes, r.min_bytes, r.max_bytes, where);
    if (!alpha.empty()) parseAlphaRange(alpha, r.min_alpha_s, r.max_alpha_s, where);
    r.algo = algo;
    r.where = where;
    rows.push_back(r);
  }
  return rows;
}

std::vector<TuningRow> parseAlgoOverride(const std::string& spec) {
  std::vector<TuningRow> rows;
  std::istringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    std::vector<std::string> parts;
    std::istringstream p(item);
    std::string part;
    while (std::getline(p, part, ':')) parts.push_back(part);
    TuningRow r;
    r.transport = "*";
    r.where = "HARP_ALGO '" + item + "'";
    if (parts.size() == 1) {
      r.coll = CollType::kAllreduce;
      r.algo = parts[0];
    } else if (parts.size() == 2) {
      r.coll = parseColl(parts[0]);
      r.algo = parts[1];
    } else if (parts.size() == 3) {
      r.coll = parseColl(parts[0]);
      parseRange(parts[1], r.min_bytes, r.max_bytes, "HARP_ALGO");
      r.algo = parts[2];
    } else {
      throw InvalidArgument("HARP_ALGO: cannot parse '" + item + "' (use algo, coll:algo or coll:lo-hi:algo)");
    }
    rows.push_back(r);
  }
  return rows;
}

const TuningTable& TuningTable::builtin() {
  static const TuningTable t = [] {
    TuningTable b;
    b.rows = parseTuning(kBuiltinTuningTable, "core/select/tuning.tsv");
    return b;
  }();
  return t;
}

TuningTable TuningTable::fromEnvironment() {
  TuningTable t;
  t.overrides = parseAlgoOverride(env::str("HARP_ALGO"));
  std::string file = env::str("HARP_TUNING_FILE");
  if (file.empty()) {
    t.rows = parseTuning(kBuiltinTuningTable, "core/select/tuning.tsv");
  } else {
    std::ifstream f(file);
    if (!f) throw InvalidArgument("HARP_TUNING_FILE='" + file + "' cannot be read");
    std::stringstream ss;
    ss << f.rdbuf();
    t.rows = parseTuning(ss.str(), file);
  }
  return t;
}

TuningTable::Match TuningTable::match(CollType c, std::string_view transport, int ranks, size_t bytes,
                                      double alpha_s) const {
  Match m;
  for (const auto* list : {&overrides, &rows})
    for (const auto& r : *list) {
      if (r.coll != c) continue;
      if (r.transport != "*" && r.transport != transport) continue;
      if (ranks < r.min_ranks || ranks > r.max_ranks) continue;
      if (bytes < r.min_bytes || bytes >= r.max_bytes) continue;
      if (alpha_s < r.min_alpha_s || alpha_s >= r.max_alpha_s) {
        if (!m.other_line) m.other_line = &r;
        continue;
      }
      m.row = &r;
      m.override = list == &overrides;
      return m;
    }
  return m;
}

std::string TuningTable::lookup(CollType c, const std::string& transport, int ranks, size_t bytes) const {
  Match m = match(c, transport, ranks, bytes);
  return m.row ? m.row->algo : "";
}

}  // namespace harp
