#include "base/params.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "base/log.h"
#include "base/types.h"

extern char** environ;

namespace harp::params {
namespace {

constexpr Param kParams[] = {
#define HARP_PARAM(name, type, def, choices, scope, doc) {#name, Type::k##type, def, choices, Scope::k##scope, doc},
#include "base/params.def"
#undef HARP_PARAM
};
constexpr size_t kCount = sizeof kParams / sizeof kParams[0];

}  // namespace

const Param* begin() { return kParams; }
const Param* end() { return kParams + kCount; }
size_t count() { return kCount; }

const Param* find(std::string_view name) {
  for (const Param& p : kParams)
    if (name == p.name) return &p;
  return nullptr;
}

const char* typeName(Type t) {
  static const char* names[] = {"int", "real", "seconds", "bytes", "string", "bool", "enum"};
  return names[static_cast<int>(t)];
}

const char* scopeName(Scope s) {
  static const char* names[] = {"library", "launcher", "bench", "test", "build"};
  return names[static_cast<int>(s)];
}

const Param& require(const char* name, Type type) {
  const Param* p = find(name);
  if (!p)
    throw Error(Error::kInternal, std::string(name) +
                                      " is read but not declared in base/params.def (declare it there, "
                                      "with its type, default and doc)");
  if (type != Type::kString && p->type != type)
    throw Error(Error::kInternal, std::string(name) + " is declared as " + typeName(p->type) +
                                      " in base/params.def but read as " + typeName(type));
  return *p;
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest(std::string_view name) {
  const Param* best = &kParams[0];
  size_t best_d = editDistance(name, best->name);
  for (const Param& p : kParams) {
    size_t d = editDistance(name, p.name);
    if (d < best_d) best = &p, best_d = d;
  }
  return best->name;
}

std::vector<std::pair<std::string, std::string>> unknownVariables(char** envp) {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = envp ? envp : environ; e && *e; ++e) {
    if (std::strncmp(*e, "HARP_", 5) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
    if (!find(name)) out.emplace_back(name, nearest(name));
  }
  return out;
}

std::string unknownMessage(const std::string& name, const std::string& near) {
  return name + " is not a HARP parameter (did you mean " + near + "?)";
}

void warnUnknownEnvironment() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* checked = std::getenv("HARP_PARAMS_CHECKED");  // declared in params.def
    if (checked && std::strcmp(checked, "1") == 0) return;
    for (const auto& [name, near] : unknownVariables()) HARP_WARN("%s", unknownMessage(name, near).c_str());
  });
}

}  // namespace harp::params
