#include "core/base/env.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/base/types.h"

namespace harp::env {

std::string str(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : def;
}

bool has(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

long long integer(const char* name, long long def) {
  std::string v = str(name);
  if (v.empty()) return def;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0') throw InvalidArgument(std::string(name) + "='" + v + "' is not an integer");
  return x;
}

double real(const char* name, double def) {
  std::string v = str(name);
  if (v.empty()) return def;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (*end != '\0') throw InvalidArgument(std::string(name) + "='" + v + "' is not a number");
  return x;
}

double checkTimeout(double x, const std::string& what) {
  if (std::isnan(x) || x <= 0)
    throw InvalidArgument(what + "=" + std::to_string(x) +
                          ": a timeout must be a positive number of seconds (or inf for none)");
  return x;
}

double timeout(const char* name, double def) {
  std::string v = str(name);
  if (v.empty()) return def;
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || std::isnan(x) || x <= 0)
    throw InvalidArgument(std::string(name) + "='" + v +
                          "' is not a timeout: use a positive number of seconds, or inf for no timeout");
  return x;  // huge values (1e13, inf, ERANGE overflow) saturate in Deadline::after
}

size_t parseBytes(const std::string& v, const char* what) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  std::string suf(end);
  size_t mult = 1;
  if (suf == "" || suf == "B") mult = 1;
  else if (suf == "K" || suf == "k" || suf == "KB") mult = 1ull << 10;
  else if (suf == "M" || suf == "MB") mult = 1ull << 20;
  else if (suf == "G" || suf == "GB") mult = 1ull << 30;
  else throw InvalidArgument(std::string(what) + ": '" + v + "' is not a size (use e.g. 512K, 4M)");
  if (end == v.c_str() || x < 0) throw InvalidArgument(std::string(what) + ": '" + v + "' is not a size");
  return static_cast<size_t>(x * mult);
}

size_t bytes(const char* name, size_t def) {
  std::string v = str(name);
  return v.empty() ? def : parseBytes(v, name);
}

int availableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

}  // namespace harp::env
