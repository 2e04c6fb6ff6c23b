// base/env.h — typed access to HARP_* environment variables, and the CPUs the
// process may use.
//
// Every name read here must be declared in base/params.def (type, default,
// scope, doc); the default comes from there, never from the call site:
//
//   size_t seg = env::bytes("HARP_SEGMENT_BYTES");   // declared Bytes, "512K"
//   long slots = env::integerOr("HARP_SHM_SLOTS", computed);  // declared "auto"
//
// Reading an undeclared name, reading a parameter as another type than it is
// declared with, reading an "auto" parameter without giving the computed
// default, or giving one for a parameter with a fixed default throws
// Error(kInternal) naming it: a programming error that the first test reaching
// the read reports. A value that does not parse throws InvalidArgument naming
// the variable and the bad value. An empty variable counts as unset.
// Thread-safe (reads the environment; the registry is constant data).
#pragma once

#include <string>

namespace harp::env {

// The value, or the declared default. Any parameter type may be read as text.
std::string str(const char* name);
// Set and non-empty in the environment (declared names only).
bool has(const char* name);
// getenv(name) after the declaration check: nullptr when unset.
const char* raw(const char* name);
long long integer(const char* name);  // Int
double real(const char* name);        // Real
// Bool: 1/0, true/false, yes/no, on/off (any case), or an integer (non-zero: true).
bool flag(const char* name);
// Seconds: a positive number, or "inf" for none (saturated to kForeverS by
// Deadline). Zero, negative, NaN or text throw InvalidArgument naming the variable.
double timeout(const char* name);
// Bytes: K/M/G suffixes (powers of two): "512K", "4M".
size_t bytes(const char* name);

// Parameters declared with default "auto": the reader computes the default.
long long integerOr(const char* name, long long computed);
double realOr(const char* name, double computed);
double timeoutOr(const char* name, double computed);

// The same check as timeout() for a timeout given in code (`what` names it in the error).
double checkTimeout(double seconds, const std::string& what);
size_t parseBytes(const std::string& s, const char* what);

// One warning per HARP_* variable of the environment that params.def does not
// declare, naming the nearest declared one; once per process (called at
// communicator creation). See params::warnUnknownEnvironment.
void warnUnknownVariables();

// Cores this process may run on: its affinity mask, as taskset, mpirun
// --bind-to or cgroups set it (at least 1). Waits use it to decide how long
// to spin: when a host's ranks outnumber these, a spinning rank holds the
// core the rank it waits for needs.
int availableCpus();

// Names the calling thread (at most 15 characters show) so that top -H, perf,
// gdb and /proc/<pid>/task/*/comm tell HARP's threads from the application's.
void nameThread(const char* name);

}  // namespace harp::env
