// bench/sim/emit/schedule.h — the per-rank operation log that harp_sched
// writes: what one rank of a collective does, in order, as HARP's own
// algorithm code issues it (bench/sim/emit/trace_context.cc records it).
//
// Usage: Schedule s(p); s.begin(rank); ...the algorithm runs, the trace
// Context calls send/recv/wait/work...; s.write(out, header).
// File format (text, one operation per line; bench/sim/schedule.py reads it):
//   # harp-schedule 1 <key=value ...>      header: coll, algo, p, bytes, hosts, ...
//   R <rank>                                the following lines are this rank's
//   S <id> <peer> <bytes> <comm>            isend: request id, global peer, bytes
//   V <id> <peer> <bytes> <comm>            irecv
//   W <id> [<id> ...]                       a wait covering these requests
//   X <kind> <bytes>                        local work on <bytes> of input:
//                                           reduce, narrow, widen, addwide, copy, fill
//   A <job>                                 the lines up to the matching E are job <job>
//   ...                                       of the rank's worker lane (an asynchronous leg,
//   E                                         Group::submit): the lane runs its jobs in order,
//                                             beside the rank's own lines
//   J <job>                                 wait until the lane has finished job <job>
// Request ids are per rank (the lane's share the rank's numbering). <comm> names the connection set: 0 for the collective's own communicator,
// 1 + leg index for a hierarchical algorithm's sub-communicators (each leg
// runs on its own pairs, so per-pair FIFO matching is per (src, dst, comm)).
//
// Threading: single-threaded (one rank runs at a time).
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace harp::sim {

struct Op {
  char kind;         // 'S', 'V', 'W', 'X', 'A', 'E', 'J'
  int peer = -1;     // S, V; A, J: the job
  uint64_t bytes = 0;
  int comm = 0;      // S, V
  uint32_t id = 0;   // S, V
  std::vector<uint32_t> ids;  // W
  const char* what = nullptr; // X
};

class Schedule {
 public:
  explicit Schedule(int p) : ranks_(p) {}
  void begin(int rank) { cur_ = rank; next_id_ = 0; next_job_ = 0; }
  int rank() const { return cur_; }
  uint32_t post(char kind, int peer, uint64_t bytes, int comm);
  void wait(std::vector<uint32_t> ids);
  void work(const char* what, uint64_t bytes);
  // An asynchronous leg: beginJob() returns its number, the operations up to
  // endJob() are the job's; join(job) is the rank's wait for it.
  int beginJob();
  void endJob();
  void join(int job);
  // Messages (S lines) so far, all ranks; limit > 0: post() throws TooMany past it.
  uint64_t messages() const { return messages_; }
  void setLimit(uint64_t limit) { limit_ = limit; }
  struct TooMany : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  // Totals of one rank (the test compares them with the cost formulas).
  uint64_t sent(int rank) const;
  uint64_t received(int rank) const;
  void write(std::FILE* f, const std::string& header) const;

 private:
  std::vector<std::vector<Op>> ranks_;
  int cur_ = 0;
  uint32_t next_id_ = 0;
  int next_job_ = 0;
  uint64_t messages_ = 0, limit_ = 0;
};

// The schedule the running algorithm records into (set by main while a rank runs).
Schedule& current();
void setCurrent(Schedule* s);

}  // namespace harp::sim
