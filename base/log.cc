#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <algorithm>
#include <cstdint>
#include <pthread.h>
#include <strings.h>

#include "base/env.h"

namespace harp {
namespace {
std::atomic<int> g_rank{-1};

LogLevel parseLevel() {
  const char* v = env::raw("HARP_DEBUG");
  if (!v || !*v) return LogLevel::kWarn;
  if (!strcasecmp(v, "NONE") || !strcasecmp(v, "OFF")) return LogLevel::kNone;
  if (!strcasecmp(v, "INFO")) return LogLevel::kInfo;
  if (!strcasecmp(v, "TRACE")) return LogLevel::kTrace;
  return LogLevel::kWarn;
}

// Parsed on first use and again in a forked child at its first use after the
// fork (launchers fork ranks and set HARP_DEBUG in the child: a level the
// parent had cached would otherwise win, e.g. WARN lines under HARP_DEBUG=NONE).
constexpr int64_t kUnparsed = -1;  // never a level or a (32-bit) subsystem mask
std::atomic<int64_t> g_level{kUnparsed};
std::atomic<int64_t> g_mask{kUnparsed};
void resetAfterFork() {
  g_level.store(kUnparsed, std::memory_order_relaxed);
  g_mask.store(kUnparsed, std::memory_order_relaxed);
}
const int g_atfork = pthread_atfork(nullptr, nullptr, resetAfterFork);
}  // namespace

LogLevel logLevel() {
  int64_t v = g_level.load(std::memory_order_relaxed);
  if (v == kUnparsed) g_level.store(v = static_cast<int64_t>(parseLevel()), std::memory_order_relaxed);
  return static_cast<LogLevel>(v);
}

void setLogRank(int rank) { g_rank.store(rank); }

namespace {
struct SubsysName {
  const char* name;
  LogSubsys bit;
};
constexpr SubsysName kSubsys[] = {{"MISC", LogSubsys::kMisc}, {"INIT", LogSubsys::kInit}, {"COLL", LogSubsys::kColl},
                                  {"P2P", LogSubsys::kP2p},   {"NET", LogSubsys::kNet},   {"SHM", LogSubsys::kShm},
                                  {"TUNING", LogSubsys::kTuning}, {"OBS", LogSubsys::kObs}, {"ALL", LogSubsys::kAll}};

unsigned parseSubsys() {
  std::string v = env::str("HARP_DEBUG_SUBSYS");
  bool invert = !v.empty() && v[0] == '^';
  if (invert) v.erase(0, 1);
  unsigned mask = 0;
  size_t i = 0;
  while (i <= v.size()) {
    size_t j = v.find(',', i);
    if (j == std::string::npos) j = v.size();
    std::string w = v.substr(i, j - i);
    i = j + 1;
    if (w.empty()) continue;
    bool known = false;
    for (const auto& s : kSubsys)
      if (!strcasecmp(w.c_str(), s.name)) mask |= static_cast<unsigned>(s.bit), known = true;
    if (!known) {
      char line[256];
      int n = snprintf(line, sizeof line, "HARP WARN HARP_DEBUG_SUBSYS: unknown subsystem '%s' (known: MISC, INIT, "
                       "COLL, P2P, NET, SHM, TUNING, OBS, ALL)\n", w.c_str());
      ssize_t r = ::write(2, line, std::min<size_t>(n, sizeof line - 1));
      (void)r;
    }
  }
  if (mask == 0 && !invert) mask = static_cast<unsigned>(LogSubsys::kAll);
  return invert ? (static_cast<unsigned>(LogSubsys::kAll) & ~mask) : mask;
}

void vlog(LogLevel level, const char* subsys, const char* fmt, va_list ap) {
  static const char* names[] = {"", "WARN", "INFO", "TRACE"};
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  char line[2048];
  int r = g_rank.load();
  char rank[16];
  if (r < 0) snprintf(rank, sizeof rank, "-"); else snprintf(rank, sizeof rank, "%d", r);
  int n = snprintf(line, sizeof line, "HARP %s:%d [%s] %s %s%s", host, (int)getpid(), rank,
                   names[static_cast<int>(level)], subsys, *subsys ? " " : "");
  n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  if (n > (int)sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = ::write(2, line, n);
  (void)w;
}
}  // namespace

unsigned logSubsysMask() {
  int64_t v = g_mask.load(std::memory_order_relaxed);
  if (v == kUnparsed) g_mask.store(v = static_cast<int64_t>(parseSubsys()), std::memory_order_relaxed);
  const unsigned mask = static_cast<unsigned>(v);
  return mask;
}

const char* subsysName(LogSubsys s) {
  for (const auto& k : kSubsys)
    if (k.bit == s) return k.name;
  return "MISC";
}

void logsf(LogLevel level, LogSubsys s, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, subsysName(s), fmt, ap);
  va_end(ap);
}

void logf(LogLevel level, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, "", fmt, ap);
  va_end(ap);
}

}  // namespace harp
