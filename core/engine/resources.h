// core/engine/resources.h — what a running collective borrows from its
// communicator (CommResources): the connections, the reused buffers, the
// deferred descriptor checks and the knobs read once.
//
// Lifetime: owned by the Communicator (core/engine/communicator.h), filled
// when it connects and emptied by destroy(); a Context (core/engine/context.h)
// references it for one collective. Threading: see CommResources.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "base/types.h"
#include "core/engine/scratch.h"
#include "transport/transport.h"

namespace harp {

class Communicator;
namespace obs {
class Recorder;  // core/observe/recorder.h
}

// Deferred descriptor check (core/engine/context.h): the receives for the peers'
// descriptors of one call in which this rank only sent, kept posted past that
// call (per-pair FIFO keeps them ahead of the next call's messages) and
// compared by the next call or by destroy().
struct DeferredCheck {
  Descriptor mine;                        // what this rank called
  bool received = false;                  // this rank also received data in that call
  std::vector<char> compared;             // by reqs index: compared during that call (received)
  std::vector<Descriptor> theirs;         // by peer rank
  std::vector<transport::Request> reqs;   // capacity reserved: the transports hold pointers
};

// What a running collective borrows from its communicator: the connections
// and the buffers reused across calls. The communicator owns it, fills it in
// when it connects (connectAll) and empties it in destroy(); a Context
// (core/engine/context.h) holds a reference to it for one collective. Threading:
// touched only by the thread executing a collective (under the
// communicator's execution lock), except `transports`, which abort() also
// walks (Transport::abort is callable from any thread).
struct CommResources {
  // First members, destroyed last: the transports may hold pointers into them.
  // A ring of check_window + 1 sets, sized once (Communicator's constructor):
  // up to check_window earlier calls' and this call's, oldest first,
  // deferred[(deferred_head + i) % deferred.size()], i < deferred_n; their
  // vectors keep their capacity from call to call.
  std::vector<DeferredCheck> deferred;
  int deferred_head = 0, deferred_n = 0;
  int check_window = 8;        // HARP_CHECK_WINDOW: deferred checks left open before a call waits
  std::vector<std::unique_ptr<transport::Transport>> transports;  // every transport in use
  std::vector<transport::Transport*> transport_of;  // by peer rank (nullptr for self)
  std::vector<transport::Pair*> pair_of;            // by peer rank (nullptr for self)
  int spin = 64;               // HARP_SPIN: progress polls before yielding, then blocking
  size_t spin_bytes = 0;       // HARP_SPIN_BYTES: waits on more pending bytes than this do not spin
  size_t segment_bytes = 0;    // HARP_SEGMENT_BYTES: pipelining segment
  Scratch scratch;                     // Context::scratch (core/engine/scratch.h)
  size_t scratch_keep = 0;             // HARP_SCRATCH_KEEP_BYTES: scratch kept between collectives
  std::vector<Descriptor> check_buf;   // peers' descriptors (Context::startCheck)
  Communicator* owner = nullptr;       // Topology: Context::subComms asks it
  // Observability: the flight recorder (nullptr: HARP_FR_ENTRIES=0)
  // and HARP_STALL_WARNING_S, read once; Context::waitAll's stall check.
  obs::Recorder* recorder = nullptr;
  double stall_warning_s = 60;
  // Context::algorithmState: what an algorithm keeps between its calls on this
  // communicator (ring_weighted's link rates), by the algorithm's key.
  std::unordered_map<const void*, std::shared_ptr<void>> algo_state;
};

}  // namespace harp
