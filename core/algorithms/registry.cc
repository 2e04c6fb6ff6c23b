// core/algorithms/registry.cc — the registry behind HARP_REGISTER_ALGORITHM.
//
// Entries live in a std::deque (stable addresses) created on first use, so
// registrars in any translation unit may run in any static-initialisation
// order. Each registration re-sorts its collective by name and renumbers
// Algorithm::index; lookups afterwards only read.
#include "core/algorithms/registry.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>

namespace harp {
namespace {
struct Registry {
  std::mutex mu;
  std::deque<Algorithm> all;
  std::vector<const Algorithm*> by_coll[kNumCollTypes];  // sorted by name
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: lookups may run during exit
  return *r;
}
}  // namespace

AlgorithmRegistrar::AlgorithmRegistrar(const AlgorithmSpec& spec) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const auto c = static_cast<unsigned>(spec.coll);
  // A malformed spec is dropped; the collective's missing algorithm then shows
  // in registryProblems() and the tests.
  if (c >= static_cast<unsigned>(kNumCollTypes) || !spec.name || !spec.fn) return;
  Algorithm a;
  static_cast<AlgorithmSpec&>(a) = spec;
  r.all.push_back(a);
  auto& list = r.by_coll[c];
  list.push_back(&r.all.back());
  std::sort(list.begin(), list.end(), [](const Algorithm* x, const Algorithm* y) {
    return std::strcmp(x->name, y->name) < 0;
  });
  for (size_t i = 0; i < list.size(); ++i) const_cast<Algorithm*>(list[i])->index = static_cast<unsigned>(i);
}

const Algorithm* findAlgorithm(CollType c, std::string_view name) {
  const auto ci = static_cast<unsigned>(c);
  if (ci >= static_cast<unsigned>(kNumCollTypes)) return nullptr;
  for (const Algorithm* a : registry().by_coll[ci])
    if (name == a->name) return a;
  return nullptr;
}

std::vector<const Algorithm*> algorithmsOf(CollType c) {
  const auto ci = static_cast<unsigned>(c);
  if (ci >= static_cast<unsigned>(kNumCollTypes)) return {};
  return registry().by_coll[ci];
}

std::string algorithmList(CollType c) {
  std::string out;
  for (const Algorithm* a : algorithmsOf(c)) out += (out.empty() ? "" : ", ") + std::string(a->name);
  return out;
}

namespace {
bool unrestricted(const Restrictions& r) {
  return !r.pow2_ranks && !r.commutative_op && r.in_place == InPlace::kAny && !r.transport && r.min_ranks <= 1 &&
         r.max_ranks == 0 && r.max_count == 0 && r.min_hosts <= 1 && r.min_local_ranks <= 1 && !r.uniform_hosts;
}

// Follows a's fallback chain; "" when it ends at an algorithm without one.
std::string fallbackProblem(const Algorithm* a) {
  const Algorithm* cur = a;
  for (int hops = 0; cur->fallback; ++hops) {
    const Algorithm* next = findAlgorithm(cur->coll, cur->fallback);
    std::string where = std::string(collName(a->coll)) + " algorithm " + cur->name;
    if (!next) return where + ": fallback '" + cur->fallback + "' is not registered";
    if (hops > kNumCollTypes + 16) return std::string(collName(a->coll)) + " algorithm " + a->name + ": fallback cycle";
    cur = next;
  }
  return "";
}
}  // namespace

std::string registryProblems() {
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
  for (int c = 0; c < kNumCollTypes; ++c) {
    const auto list = algorithmsOf(static_cast<CollType>(c));
    const std::string cn = collName(static_cast<CollType>(c));
    if (list.empty()) add(cn + ": no algorithm registered");
    if (list.size() > 16) add(cn + ": more than 16 algorithms (the tag carries 4 bits)");
    bool any_free = false;
    for (size_t i = 0; i < list.size(); ++i) {
      if (i && std::strcmp(list[i - 1]->name, list[i]->name) == 0) add(cn + ": algorithm " + list[i]->name + " registered twice");
      any_free |= unrestricted(list[i]->restrictions);
      std::string f = fallbackProblem(list[i]);
      if (!f.empty()) add(f);
    }
    if (!list.empty() && !any_free) add(cn + ": every algorithm has restrictions (none to fall back to)");
  }
  return out;
}

void copyBytes(void* dst, const void* src, size_t n) {
  if (n && dst != src) std::memmove(dst, src, n);
}

bool aliasesOtherBlock(const char* in, const char* out, int r, int p, size_t blk) {
  return in != out + r * blk && in < out + p * blk && out < in + blk;
}

int floorPow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int ceilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

}  // namespace harp
