// bench/sim/emit/frames.h — which global ranks a traced Context runs on, and
// the sub-communicators (SubComms) a hierarchical algorithm sees in harp_sched.
//
// Usage (main.cc): setLayout(p, hosts, policy); for each rank r:
// setNextFrame(frame of the whole communicator), construct a Context, run the
// algorithm. The Context takes the frame (takeNextFrame); a leg run through
// a trace Group (trace_groups.cc) sets the leg's frame before its Context.
// Block placement: host h holds ranks [h*L, (h+1)*L), L = p / hosts.
//
// Threading: single-threaded.
#pragma once

#include <string>
#include <vector>

#include "core/topology/topology.h"

namespace harp::sim {

struct Frame {
  std::vector<int> ranks;  // local rank -> global rank
  int comm = 0;            // 0: the collective's own communicator; 1 intra, 2 rail
};

// Which algorithm each leg of a hierarchical collective runs: "" picks
// HARP's tuning-table choice for the leg (core/select/tuning.tsv rows for
// shm inside a host and tcp between hosts at RTT <= 100 us).
struct LegPolicy {
  std::string intra_reduce, intra_broadcast, leaders_allreduce;
  size_t segment_bytes = 512 * 1024;  // HARP_SEGMENT_BYTES of the legs
};

void setLayout(int p, int hosts, const LegPolicy& policy);
void setNextFrame(Frame f);
Frame takeNextFrame(int size);          // throws if none is set or its size differs
SubComms& subCommsOf(const Frame& f);   // the SubComms of the rank now running (frame comm 0 only)

}  // namespace harp::sim
