#include "core/base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "core/base/env.h"

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
}  // namespace

LogLevel logLevel() {
  static const LogLevel level = parseLevel();
  return level;
}

void setLogRank(int rank) { g_rank.store(rank); }

void logf(LogLevel level, const char* fmt, ...) {
  static const char* names[] = {"", "WARN", "INFO", "TRACE"};
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  char line[2048];
  int r = g_rank.load();
  char rank[16];
  if (r < 0) snprintf(rank, sizeof rank, "-"); else snprintf(rank, sizeof rank, "%d", r);
  int n = snprintf(line, sizeof line, "HARP %s:%d [%s] %s ", host, (int)getpid(), rank,
                   names[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = ::write(2, line, n);
  (void)w;
}

}  // namespace harp
