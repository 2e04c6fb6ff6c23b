// base/log.h — HARP's diagnostic output, controlled by HARP_DEBUG.
//
// HARP_DEBUG=WARN (default) | INFO | TRACE | NONE. Lines go to stderr as
//   "HARP host:pid [rank] LEVEL message".
// HARP_DEBUG=INFO shows per-communicator setup: the transport chosen for each
// peer and the algorithm chosen for each collective the first time it runs.
// Thread-safe; each line is written with one write(2).
//
// Subsystems (like NCCL_DEBUG_SUBSYS): HARP_DEBUG_SUBSYS=INIT,COLL
// keeps only INFO/TRACE lines of those subsystems ("^INIT,NET": all but
// those; default ALL). WARN lines always show. Lines logged with a subsystem
// name it after the level:
//   HARP_INFO_S(LogSubsys::kInit, "comm %llx ready", id);  ->  "... INFO INIT comm ... ready"
// HARP_INFO / HARP_TRACE without one belong to MISC.
#pragma once

#include <cstdarg>

namespace harp {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };
enum class LogSubsys : unsigned {
  kMisc = 1, kInit = 2, kColl = 4, kP2p = 8, kNet = 16, kShm = 32, kTuning = 64, kObs = 128, kAll = 0xffu
};

LogLevel logLevel();
// HARP_DEBUG_SUBSYS as a mask of LogSubsys bits (parsed once; unknown names warn once).
unsigned logSubsysMask();
inline bool logEnabled(LogLevel level, LogSubsys s) {
  return static_cast<int>(logLevel()) >= static_cast<int>(level) &&
         (level == LogLevel::kWarn || (logSubsysMask() & static_cast<unsigned>(s)));
}
const char* subsysName(LogSubsys s);
void logsf(LogLevel level, LogSubsys s, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void setLogRank(int rank);  // prefix for this process's lines ("-" until set)
void logf(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace harp

#define HARP_LOG(level, ...)                                                    \
  do {                                                                          \
    if (::harp::logEnabled(level, ::harp::LogSubsys::kMisc)) ::harp::logf(level, __VA_ARGS__); \
  } while (0)
#define HARP_WARN(...) HARP_LOG(::harp::LogLevel::kWarn, __VA_ARGS__)
#define HARP_INFO(...) HARP_LOG(::harp::LogLevel::kInfo, __VA_ARGS__)
#define HARP_TRACE(...) HARP_LOG(::harp::LogLevel::kTrace, __VA_ARGS__)
// With a subsystem (::harp::LogSubsys::kInit etc.; see the top of this file).
#define HARP_LOG_S(level, subsys, ...)                                                   \
  do {                                                                                   \
    if (::harp::logEnabled(level, subsys)) ::harp::logsf(level, subsys, __VA_ARGS__);    \
  } while (0)
#define HARP_INFO_S(subsys, ...) HARP_LOG_S(::harp::LogLevel::kInfo, subsys, __VA_ARGS__)
#define HARP_TRACE_S(subsys, ...) HARP_LOG_S(::harp::LogLevel::kTrace, subsys, __VA_ARGS__)
