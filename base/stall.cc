// base/stall.cc — the process's stall hooks (see stall.h).
#include "base/stall.h"

#include <map>
#include <mutex>
#include <utility>

namespace harp::stall {
namespace {
struct Entry {
  double after_s;
  Fn fn;
};
std::mutex& mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::map<std::pair<uint64_t, int>, Entry>& hooks() {
  static auto* h = new std::map<std::pair<uint64_t, int>, Entry>;
  return *h;
}
}  // namespace

void set(uint64_t comm_id, int rank, double after_s, Fn fn) {
  std::lock_guard<std::mutex> g(mu());
  if (fn) hooks()[{comm_id, rank}] = Entry{after_s, std::move(fn)};
  else hooks().erase({comm_id, rank});
}

bool find(uint64_t comm_id, int rank, double* after_s, Fn* fn) {
  std::lock_guard<std::mutex> g(mu());
  auto it = hooks().find({comm_id, rank});
  if (it == hooks().end()) return false;
  *after_s = it->second.after_s;
  *fn = it->second.fn;
  return true;
}

}  // namespace harp::stall
