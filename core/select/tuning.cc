#include "core/select/tuning.h"

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
    std::string coll, transport, ranks, bytes, algo, extra;
    if (!(f >> coll)) continue;
    std::string where = source + ":" + std::to_string(n);
    if (!(f >> transport >> ranks >> bytes >> algo) || (f >> extra))
      throw InvalidArgument(where + ": expected 5 columns: collective transport ranks bytes algorithm");
    TuningRow r;
    r.coll = parseColl(coll);
    r.transport = transport;
    parseRanks(ranks, r.min_ranks, r.max_ranks, where);
    parseRange(bytes, r.min_bytes, r.max_bytes, where);
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

TuningTable::Match TuningTable::match(CollType c, std::string_view transport, int ranks, size_t bytes) const {
  for (const auto* list : {&overrides, &rows})
    for (const auto& r : *list) {
      if (r.coll != c) continue;
      if (r.transport != "*" && r.transport != transport) continue;
      if (ranks < r.min_ranks || ranks > r.max_ranks) continue;
      if (bytes < r.min_bytes || bytes >= r.max_bytes) continue;
      return {&r, list == &overrides};
    }
  return {};
}

std::string TuningTable::lookup(CollType c, const std::string& transport, int ranks, size_t bytes) const {
  Match m = match(c, transport, ranks, bytes);
  return m.row ? m.row->algo : "";
}

}  // namespace harp
