// core/base/log.h — HARP's diagnostic output, controlled by HARP_DEBUG.
//
// HARP_DEBUG=WARN (default) | INFO | TRACE | NONE. Lines go to stderr as
//   "HARP host:pid [rank] LEVEL message".
// HARP_DEBUG=INFO shows per-communicator setup: the transport chosen for each
// peer and the algorithm chosen for each collective the first time it runs.
// Thread-safe; each line is written with one write(2).
#pragma once

#include <cstdarg>

namespace harp {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

LogLevel logLevel();
void setLogRank(int rank);  // prefix for this process's lines ("-" until set)
void logf(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace harp

#define HARP_LOG(level, ...)                                          \
  do {                                                                \
    if (static_cast<int>(::harp::logLevel()) >= static_cast<int>(level)) \
      ::harp::logf(level, __VA_ARGS__);                               \
  } while (0)
#define HARP_WARN(...) HARP_LOG(::harp::LogLevel::kWarn, __VA_ARGS__)
#define HARP_INFO(...) HARP_LOG(::harp::LogLevel::kInfo, __VA_ARGS__)
#define HARP_TRACE(...) HARP_LOG(::harp::LogLevel::kTrace, __VA_ARGS__)
