#include "base/env.h"

#include <pthread.h>
#include <sched.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "base/params.h"
#include "base/types.h"

namespace harp::env {
namespace {

using params::Type;

const char* setValue(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// The environment's value, else the declared default; throws when the
// declaration says "auto" (the reader must use the ...Or form).
std::string valueOf(const char* name, Type type) {
  const params::Param& p = params::require(name, type);
  if (const char* v = setValue(name)) return v;
  if (std::strcmp(p.def, "auto") == 0 && type != Type::kString && type != Type::kEnum)
    throw Error(Error::kInternal, std::string(name) +
                                      " has a computed default (auto in base/params.def): read it with "
                                      "env::integerOr/realOr/timeoutOr");
  return p.def;
}

// For the ...Or readers: the parameter must be declared "auto".
const char* autoValue(const char* name, Type type) {
  const params::Param& p = params::require(name, type);
  if (std::strcmp(p.def, "auto") != 0)
    throw Error(Error::kInternal, std::string(name) + " has the default '" + p.def +
                                      "' in base/params.def; read it without a default at the call site");
  return setValue(name);
}

long long parseInteger(const char* name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    throw InvalidArgument(std::string(name) + "='" + v + "' is not an integer");
  return x;
}

double parseReal(const char* name, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw InvalidArgument(std::string(name) + "='" + v + "' is not a number");
  return x;
}

double parseTimeout(const char* name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || std::isnan(x) || x <= 0)
    throw InvalidArgument(std::string(name) + "='" + v +
                          "' is not a timeout: use a positive number of seconds, or inf for no timeout");
  return x;  // huge values (1e13, inf, ERANGE overflow) saturate in Deadline::after
}

}  // namespace

namespace dynamic {

std::string str(const char* name) { return valueOf(name, Type::kString); }

bool has(const char* name) {
  params::require(name, Type::kString);
  return setValue(name) != nullptr;
}

const char* raw(const char* name) {
  params::require(name, Type::kString);
  return std::getenv(name);
}

long long integer(const char* name) { return parseInteger(name, valueOf(name, Type::kInt)); }

double real(const char* name) { return parseReal(name, valueOf(name, Type::kReal)); }

bool flag(const char* name) {
  std::string v = valueOf(name, Type::kBool);
  for (const char* t : {"1", "true", "yes", "on"})
    if (!strcasecmp(v.c_str(), t)) return true;
  for (const char* f : {"0", "false", "no", "off"})
    if (!strcasecmp(v.c_str(), f)) return false;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (!v.empty() && *end == '\0') return x != 0;
  throw InvalidArgument(std::string(name) + "='" + v + "' is not a boolean (use 1/0, true/false, yes/no, on/off)");
}

double timeout(const char* name) { return parseTimeout(name, valueOf(name, Type::kSeconds)); }

size_t bytes(const char* name) { return parseBytes(valueOf(name, Type::kBytes), name); }

long long integerOr(const char* name, long long computed) {
  const char* v = autoValue(name, Type::kInt);
  return v ? parseInteger(name, v) : computed;
}

double realOr(const char* name, double computed) {
  const char* v = autoValue(name, Type::kReal);
  return v ? parseReal(name, v) : computed;
}

double timeoutOr(const char* name, double computed) {
  const char* v = autoValue(name, Type::kSeconds);
  return v ? parseTimeout(name, v) : computed;
}

}  // namespace dynamic

double checkTimeout(double x, const std::string& what) {
  if (std::isnan(x) || x <= 0)
    throw InvalidArgument(what + "=" + std::to_string(x) +
                          ": a timeout must be a positive number of seconds (or inf for none)");
  return x;
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
  if (end == v.c_str() || !(x >= 0)) throw InvalidArgument(std::string(what) + ": '" + v + "' is not a size");
  if (x * static_cast<double>(mult) >= 0x1p63) throw InvalidArgument(std::string(what) + ": '" + v + "' is too large");
  return static_cast<size_t>(x * mult);
}

void warnUnknownVariables() { params::warnUnknownEnvironment(); }

void nameThread(const char* name) { pthread_setname_np(pthread_self(), name); }

int availableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

}  // namespace harp::env
