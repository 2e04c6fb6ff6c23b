// core/base/env.h — typed access to HARP_* environment variables, and the CPUs the
// process may use.
// Parsing errors throw harp::Error naming the variable and the bad value.
#pragma once

#include <string>

namespace harp::env {

std::string str(const char* name, const std::string& def = "");
bool has(const char* name);
long long integer(const char* name, long long def);
double real(const char* name, double def);
// A timeout in seconds: a positive number, or "inf" for none (saturated to
// kForeverS by Deadline). Zero, negative, NaN or text throw InvalidArgument
// naming the variable.
double timeout(const char* name, double def);
// The same check for a timeout given in code (`what` names it in the error).
double checkTimeout(double seconds, const std::string& what);
// Sizes accept K/M/G suffixes (powers of two): "512K", "4M".
size_t bytes(const char* name, size_t def);
size_t parseBytes(const std::string& s, const char* what);

// Cores this process may run on: its affinity mask, as taskset, mpirun
// --bind-to or cgroups set it (at least 1). Waits use it to decide how long
// to spin: when a host's ranks outnumber these, a spinning rank holds the
// core the rank it waits for needs.
int availableCpus();

}  // namespace harp::env
