// base/env.h — typed access to HARP_* environment variables, and the CPUs the
// process may use.
//
// Every name read here must be declared in base/params.def (type, default,
// scope, doc); the default comes from there, never from the call site:
//
//   size_t seg = env::bytes("HARP_SEGMENT_BYTES");   // declared Bytes, "512K"
//   long slots = env::integerOr("HARP_SHM_SLOTS", computed);  // declared "auto"
//
// The name is checked at compile time (Name below, against
// params::decl, built from params.def): reading an undeclared name, reading
// a parameter as another type than it is declared with, reading an "auto"
// parameter without giving the computed default, or giving one for a
// parameter with a fixed default does not compile; the error names the
// rule (e.g. "HARP_name_is_not_declared_in_base_params_def"). Names known
// only at run time (a test walking the registry) go through env::dynamic,
// which makes the same checks and throws Error(kInternal) naming the
// variable. A value that does not parse throws InvalidArgument naming the
// variable and the bad value. An empty variable counts as unset.
// Thread-safe (reads the environment; the registry is constant data).
#pragma once

#include <cstddef>
#include <string>

#include "base/params.h"

namespace harp::env {

// Run-time names: the same reads, checked when they run (the functions below
// forward here once the compiler has checked the name).
namespace dynamic {
std::string str(const char* name);
bool has(const char* name);
const char* raw(const char* name);
long long integer(const char* name);
double real(const char* name);
bool flag(const char* name);
double timeout(const char* name);
size_t bytes(const char* name);
long long integerOr(const char* name, long long computed);
double realOr(const char* name, double computed);
double timeoutOr(const char* name, double computed);
}  // namespace dynamic

// Not constexpr on purpose: calling one from Name's consteval constructor
// stops the compile with its name in the message.
void HARP_name_is_not_declared_in_base_params_def();
void HARP_parameter_is_read_as_another_type_than_params_def_declares();
void HARP_auto_parameter_needs_the_computed_default_read_it_with_an_Or_function();
void HARP_parameter_with_a_fixed_default_takes_no_computed_default();

// A HARP_* name checked at compile time against params.def. T: the type the
// read expects; kString accepts every type (text access); Auto: 1 the read
// gives a computed default (the parameter must be declared "auto"), 0 it
// does not (it must not be), -1 either.
template <params::Type T, int Auto = 0>
struct Name {
  const char* s;
  consteval Name(const char* name) : s(name) {  // NOLINT: implicit from a literal on purpose
    const params::decl::Entry* e = params::decl::lookup(name);
    if (!e) HARP_name_is_not_declared_in_base_params_def();
    if (T != params::Type::kString && e->type != T) HARP_parameter_is_read_as_another_type_than_params_def_declares();
    if (Auto == 0 && e->automatic && T != params::Type::kString)
      HARP_auto_parameter_needs_the_computed_default_read_it_with_an_Or_function();
    if (Auto == 1 && !e->automatic) HARP_parameter_with_a_fixed_default_takes_no_computed_default();
  }
};
using Any = Name<params::Type::kString, -1>;

// The value, or the declared default. Any parameter type may be read as text.
inline std::string str(Any name) { return dynamic::str(name.s); }
// Set and non-empty in the environment (declared names only).
inline bool has(Any name) { return dynamic::has(name.s); }
// getenv(name) after the declaration check: nullptr when unset.
inline const char* raw(Any name) { return dynamic::raw(name.s); }
inline long long integer(Name<params::Type::kInt> name) { return dynamic::integer(name.s); }
inline double real(Name<params::Type::kReal> name) { return dynamic::real(name.s); }
// Bool: 1/0, true/false, yes/no, on/off (any case), or an integer (non-zero: true).
inline bool flag(Name<params::Type::kBool> name) { return dynamic::flag(name.s); }
// Seconds: a positive number, or "inf" for none (saturated to kForeverS by
// Deadline). Zero, negative, NaN or text throw InvalidArgument naming the variable.
inline double timeout(Name<params::Type::kSeconds> name) { return dynamic::timeout(name.s); }
// Bytes: K/M/G suffixes (powers of two): "512K", "4M".
inline size_t bytes(Name<params::Type::kBytes> name) { return dynamic::bytes(name.s); }

// Parameters declared with default "auto": the reader computes the default.
inline long long integerOr(Name<params::Type::kInt, 1> name, long long computed) {
  return dynamic::integerOr(name.s, computed);
}
inline double realOr(Name<params::Type::kReal, 1> name, double computed) { return dynamic::realOr(name.s, computed); }
inline double timeoutOr(Name<params::Type::kSeconds, 1> name, double computed) {
  return dynamic::timeoutOr(name.s, computed);
}

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
