// base/params.h — the registry of HARP_* environment variables.
//
// Every variable HARP reads is declared once in base/params.def: name,
// type, default, scope and one line of doc (NCCL_PARAM / ompi_info style).
// Code reads values through base/env.h, which checks the name against
// params::decl (this file, from params.def) when it compiles, so a misspelt
// or mistyped read is a compile error, and takes the default from the
// declaration; names known only at run time (env::dynamic) throw
// Error(kInternal) when not declared. `harp-config --params` lists the same table (python/harp/_params.py
// parses params.def).
//
//   const params::Param* p = params::find("HARP_TIMEOUT");   // nullptr: undeclared
//   params::warnUnknownEnvironment();   // once per process, at communicator creation
//
// The table is constant data (no static constructors): usable from any thread
// and during static initialisation. warnUnknownEnvironment() is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace harp::params {

enum class Type : uint8_t { kInt, kReal, kSeconds, kBytes, kString, kBool, kEnum };
enum class Scope : uint8_t { kLibrary, kLauncher, kBench, kTest, kBuild };

struct Param {
  const char* name;
  Type type;
  const char* def;      // default as text; "" none/empty; "auto": computed by the reader
  const char* choices;  // Enum only: "A|B|C"
  Scope scope;
  const char* doc;
};

// The same declarations at compile time, for base/env.h's checked names: a
// read of a name params.def does not declare, of a parameter as another type
// than declared, or of an "auto" parameter without a computed default (or the
// other way round) does not compile.
namespace decl {
struct Entry {
  std::string_view name;
  Type type;
  bool automatic;  // default "auto": the reader computes it
};
inline constexpr Entry kAll[] = {
#define HARP_PARAM(name, type, def, choices, scope, doc) {#name, Type::k##type, std::string_view(def) == "auto"},
#include "base/params.def"
#undef HARP_PARAM
};
consteval const Entry* lookup(std::string_view name) {
  for (const Entry& e : kAll)
    if (e.name == name) return &e;
  return nullptr;
}
}  // namespace decl

// All declared parameters, in params.def order.
const Param* begin();
const Param* end();
size_t count();

// The declaration of `name`, or nullptr.
const Param* find(std::string_view name);
// The declaration of `name`; throws Error(kInternal) when it is not declared
// ("HARP_X is read but not declared in base/params.def") or, unless
// `type` is kString (text access to any parameter), when it is declared with
// another type.
const Param& require(const char* name, Type type);

const char* typeName(Type t);
const char* scopeName(Scope s);

// Levenshtein distance, and the declared name closest to `name` (ties: the first declared).
size_t editDistance(std::string_view a, std::string_view b);
std::string nearest(std::string_view name);

// Each HARP_* variable of `envp` (nullptr: this process's environment) that
// is not declared, with the declared name nearest to it, in environment order.
std::vector<std::pair<std::string, std::string>> unknownVariables(char** envp = nullptr);
// "HARP_TRANSPRT is not a HARP parameter (did you mean HARP_TRANSPORT?)"
std::string unknownMessage(const std::string& name, const std::string& nearest);
// Logs one warning (HARP_WARN) per unknown HARP_* variable, the first time it
// is called in a process; a no-op afterwards and when HARP_PARAMS_CHECKED=1
// (harp-run warned already and tells its ranks so).
void warnUnknownEnvironment();

}  // namespace harp::params
