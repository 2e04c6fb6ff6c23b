// core/context.h — what an algorithm sees while it runs one collective.
//
// A Context wraps the communicator's pairs for the duration of one collective:
// algorithms post isend/irecv to peer ranks and wait; the Context tags every
// message with the collective's descriptor (so ranks that disagree find out),
// drives the transports' progress, enforces the timeout, and turns transport
// failures into harp::Error with the peer named.
//
// Waiting policy: poll the transports, spin briefly, then sched_yield, then
// block in the transport's wait() — never burn a core when ranks outnumber
// cores.
//
// Single-threaded: used only by the thread running the collective.
#pragma once

#include <deque>
#include <initializer_list>
#include <vector>

#include "core/communicator.h"
#include "core/socket.h"
#include "transport/transport.h"

namespace harp {

using transport::Request;

class Context {
 public:
  Context(Communicator& comm, const CollArgs& args, uint64_t tag, double timeout_s);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CollArgs& args() const { return args_; }
  size_t elemSize() const { return esize_; }

  Request* isend(int peer, const void* buf, size_t bytes);
  Request* irecv(int peer, void* buf, size_t bytes);
  // The same with an explicit message tag instead of the collective's (p2p_batch:
  // each message carries the tag a single send/recv of its size would).
  Request* isend(int peer, const void* buf, size_t bytes, uint64_t tag);
  Request* irecv(int peer, void* buf, size_t bytes, uint64_t tag);
  void wait(Request* r);
  void waitAll(std::initializer_list<Request*> rs);
  void waitAll(const std::vector<Request*>& rs);
  // Post both, wait for both.
  void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes);

  // Communicator-owned scratch space, at least `bytes`, reused across calls.
  void* scratch(size_t bytes);
  // Pipelining segment size in bytes (HARP_SEGMENT_BYTES, default 512K).
  size_t segmentBytes() const;

  // For transport-specific algorithms (e.g. allreduce_shm, which reaches the
  // shm transport's shared buffers via dynamic_cast): the transport serving
  // `peer` (nullptr for this rank), this collective's tag and timeout.
  transport::Transport* transportOf(int peer) const;
  uint64_t tag() const { return tag_; }
  double timeout() const { return timeout_s_; }

 private:
  void check(Request* r);
  Communicator& comm_;
  const CollArgs& args_;
  uint64_t tag_;
  double timeout_s_;
  int rank_, size_;
  size_t esize_;
  std::deque<Request> reqs_;
};

// Tag layout: seq(12) | coll(4) | dtype(4) | op(4) | root(8) | count(32).
uint64_t makeTag(uint32_t seq, CollType c, DataType dt, ReduceOp op, int root, uint64_t count);
std::string describeTag(uint64_t tag);

// Split `count` elements into `n` blocks as evenly as possible (the first
// count % n blocks get one more). Used by every block-partitioned algorithm.
struct Blocks {
  size_t count, n;
  size_t size(size_t i) const { return count / n + (i < count % n ? 1 : 0); }
  size_t offset(size_t i) const { return i * (count / n) + (i < count % n ? i : count % n); }
};

}  // namespace harp
