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

#include "core/select/cost.h"
#include "core/select/tuning.h"
#include "core/topology/topology.h"

namespace harp::sim {

struct Frame {
  std::vector<int> ranks;  // local rank -> global rank
  int comm = 0;            // 0: the collective's own communicator; 1 intra, 2 rail
};

// Which algorithm each leg of a hierarchical collective runs: "" lets
// HARP's selector (core/select: selectAlgorithm with `table` and `cal`) pick
// it as the sub-communicator would at run time: transport shm and one host of
// L ranks inside a host, tcp and H hosts of one rank between them.
struct LegPolicy {
  std::string intra_reduce, intra_broadcast, leaders_allreduce;
  size_t segment_bytes = 512 * 1024;  // HARP_SEGMENT_BYTES of the legs
  const Calibration* cal = nullptr;   // set by main
  const TuningTable* table = nullptr;
};

void setLayout(int p, int hosts, const LegPolicy& policy);
void setNextFrame(Frame f);
Frame takeNextFrame(int size);          // throws if none is set or its size differs
SubComms& subCommsOf(const Frame& f);   // the SubComms of the rank now running (frame comm 0 only)
// Reserved, never-touched address space (trace_memory.cc); copies into or out
// of it are recorded, not done, while recording is on.
void* reserveRegion(size_t bytes);
void setRecording(bool on);

}  // namespace harp::sim
