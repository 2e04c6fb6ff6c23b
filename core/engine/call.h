// core/engine/call.h — what one call is: its arguments (CollArgs and the
// options and pieces it carries) and the handle it returns (Work).
//
// Usage: the Communicator's submit/run take a CollArgs; an algorithm reads
// the one it runs through Context::args(); a hierarchical algorithm builds
// CollArgs for its legs (core/algorithms/group.h). Counts are in elements.
//
// Lifetime: CollArgs is a value, copied into the communicator's queue for an
// async call; the buffers it points to must outlive the call's Work.
// Threading: a Work may be waited on from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/types.h"

namespace harp {

class Communicator;

struct CommOptions {
  double timeout_s = -1;       // < 0: HARP_TIMEOUT or 300 s
  std::string transport;       // "" : HARP_TRANSPORT or automatic per peer
};

struct CollOptions {
  std::string algo;            // "" : tuning table (and HARP_ALGO)
  double timeout_s = -1;       // < 0: the communicator's timeout
  // Calls like this one that cross each host's link at once (rail's L rails, one per local
  // rank): the selector prices this call's flows at that share of the link. Internal: set by
  // hierarchical algorithms for their legs, the same on every rank of the leg.
  int link_flows = 1;
};

// One send or receive of a p2p_batch (NCCL's grouped ncclSend/ncclRecv). Each
// travels exactly like a single send/recv with the batch's dtype and tag, so
// it matches a plain send/recv on the peer; peer == this rank is a local copy
// paired, in order, with this rank's own receive.
struct P2pOp {
  bool send = true;
  int peer = -1;
  void* buf = nullptr;  // read for a send, written for a receive
  size_t count = 0;     // elements
};

// One buffer of an allreduce_coalesced: `count` elements of the
// call's dtype, reduced from `send` into `recv` (the same pointer: in place;
// otherwise the two must not overlap). Pieces must not overlap each other.
struct BufPiece {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
};

// Compression: how a float32 sum/avg allreduce may travel
// compressed (core/compress/compress.h has the whole story: kinds, gate, residuals).
// kDefault takes the communicator's HARP_COMPRESS; other collectives, dtypes
// and ops ignore it.
class CompressEngine;
enum class CompressKind : uint8_t { kDefault, kNone, kFp16, kBf16, kTopk };
struct CompressSpec {
  CompressKind kind = CompressKind::kDefault;
  double ratio = 0;   // top-k: fraction of the elements each rank sends (when k == 0)
  uint64_t k = 0;     // top-k: elements each rank sends
  bool ef = false;    // top-k: error feedback (the library keeps a residual per key)
  bool force = false; // compress even where the gate would not (cost model, same-host peers)
  std::string key;    // top-k residual key ("": recvbuf address and count)
  CompressEngine* engine = nullptr;  // set when dispatched (state for the algorithm)
};

// Everything a collective needs; counts are in elements.
struct CollArgs {
  CollType coll = CollType::kAllreduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  // allreduce/broadcast/reduce: total; allgather/gather: per rank sent;
  // reduce_scatter/scatter: per rank received; alltoall: per pair; send/recv: total.
  size_t count = 0;
  DataType dtype = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;   // rooted collectives
  int peer = -1;  // send/recv
  uint32_t tag = 0;  // send/recv user tag
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;  // alltoallv
  std::vector<P2pOp> p2p;  // p2p_batch: posted together, then waited for together
  std::vector<BufPiece> pieces;  // allreduce_coalesced: the buffers, in order (count = their sum)
  CollOptions opts;
  CompressSpec compress;  // Compression: allreduce only
};

class Work {
 public:
  // Waits for completion (timeout_s < 0: forever; the collective itself has a
  // timeout). Throws the collective's error. Returns false on timeout.
  bool wait(double timeout_s = -1);
  bool test();  // true when finished (successfully or not); never throws
  bool failed();
  std::string error();

 private:
  friend class Communicator;
  void finish(std::exception_ptr e);
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> on_done_;
};

}  // namespace harp
