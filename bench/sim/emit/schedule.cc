// bench/sim/emit/schedule.cc — the per-rank operation log (schedule.h).
#include "bench/sim/emit/schedule.h"

#include <stdexcept>

namespace harp::sim {
namespace {
Schedule* g_current = nullptr;
}

Schedule& current() {
  if (!g_current) throw std::logic_error("harp_sched: an algorithm ran with no schedule to record into");
  return *g_current;
}
void setCurrent(Schedule* s) { g_current = s; }

uint32_t Schedule::post(char kind, int peer, uint64_t bytes, int comm) {
  if (kind == 'S' && ++messages_ > limit_ && limit_ > 0)
    throw TooMany("more than " + std::to_string(limit_) + " messages (--max-msgs)");
  Op o;
  o.kind = kind;
  o.peer = peer;
  o.bytes = bytes;
  o.comm = comm;
  o.id = next_id_++;
  ranks_[cur_].push_back(std::move(o));
  return ranks_[cur_].back().id;
}

void Schedule::wait(std::vector<uint32_t> ids) {
  if (ids.empty()) return;
  Op o;
  o.kind = 'W';
  o.ids = std::move(ids);
  ranks_[cur_].push_back(std::move(o));
}

void Schedule::work(const char* what, uint64_t bytes) {
  if (!bytes) return;
  Op o;
  o.kind = 'X';
  o.what = what;
  o.bytes = bytes;
  ranks_[cur_].push_back(std::move(o));
}

int Schedule::beginJob() {
  Op o;
  o.kind = 'A';
  o.peer = next_job_++;
  ranks_[cur_].push_back(o);
  return o.peer;
}

void Schedule::endJob() {
  Op o;
  o.kind = 'E';
  ranks_[cur_].push_back(o);
}

void Schedule::join(int job) {
  Op o;
  o.kind = 'J';
  o.peer = job;
  ranks_[cur_].push_back(o);
}

uint64_t Schedule::sent(int rank) const {
  uint64_t n = 0;
  for (const Op& o : ranks_[rank]) n += o.kind == 'S' ? o.bytes : 0;
  return n;
}

uint64_t Schedule::received(int rank) const {
  uint64_t n = 0;
  for (const Op& o : ranks_[rank]) n += o.kind == 'V' ? o.bytes : 0;
  return n;
}

void Schedule::write(std::FILE* f, const std::string& header) const {
  std::fprintf(f, "# harp-schedule 1 %s\n", header.c_str());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    std::fprintf(f, "R %zu\n", r);
    for (const Op& o : ranks_[r]) {
      switch (o.kind) {
        case 'S':
        case 'V':
          std::fprintf(f, "%c %u %d %llu %d\n", o.kind, o.id, o.peer, static_cast<unsigned long long>(o.bytes), o.comm);
          break;
        case 'W':
          std::fputc('W', f);
          for (uint32_t id : o.ids) std::fprintf(f, " %u", id);
          std::fputc('\n', f);
          break;
        case 'A':
        case 'J':
          std::fprintf(f, "%c %d\n", o.kind, o.peer);
          break;
        case 'E':
          std::fputs("E\n", f);
          break;
        default:
          std::fprintf(f, "X %s %llu\n", o.what, static_cast<unsigned long long>(o.bytes));
      }
    }
  }
}

}  // namespace harp::sim
