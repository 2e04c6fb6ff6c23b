#include "core/context.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "core/env.h"
#include "core/log.h"

namespace harp {

uint64_t makeTag(uint32_t seq, CollType c, DataType dt, ReduceOp op, int root, uint64_t count) {
  return (static_cast<uint64_t>(seq & 0xfff) << 52) | (static_cast<uint64_t>(c) & 0xf) << 48 |
         (static_cast<uint64_t>(dt) & 0xf) << 44 | (static_cast<uint64_t>(op) & 0xf) << 40 |
         (static_cast<uint64_t>(root) & 0xff) << 32 | (count & 0xffffffffull);
}

std::string describeTag(uint64_t tag) {
  auto c = static_cast<CollType>((tag >> 48) & 0xf);
  auto dt = static_cast<DataType>((tag >> 44) & 0xf);
  auto op = static_cast<ReduceOp>((tag >> 40) & 0xf);
  int root = static_cast<int>((tag >> 32) & 0xff);
  uint64_t count = tag & 0xffffffffull;
  std::string s = std::string(collName(c)) + "(count=" + std::to_string(count) + ", dtype=" + dtypeName(dt);
  switch (c) {
    case CollType::kAllreduce:
    case CollType::kReduceScatter:
      s += std::string(", op=") + opName(op);
      break;
    case CollType::kReduce:
      s += std::string(", op=") + opName(op) + ", root=" + std::to_string(root);
      break;
    case CollType::kBroadcast:
    case CollType::kGather:
    case CollType::kScatter:
      s += ", root=" + std::to_string(root);
      break;
    case CollType::kSend:
    case CollType::kRecv:
      s += ", tag=" + std::to_string(root);
      break;
    default:
      break;
  }
  return s + ") #" + std::to_string(tag >> 52);
}

Context::Context(Communicator& comm, const CollArgs& args, uint64_t tag, double timeout_s)
    : comm_(comm), args_(args), tag_(tag), timeout_s_(timeout_s), rank_(comm.rank()), size_(comm.size()),
      esize_(dtypeSize(args.dtype)) {}

Request* Context::isend(int peer, const void* buf, size_t bytes) { return isend(peer, buf, bytes, tag_); }

Request* Context::irecv(int peer, void* buf, size_t bytes) { return irecv(peer, buf, bytes, tag_); }

Request* Context::isend(int peer, const void* buf, size_t bytes, uint64_t tag) {
  Request& r = reqs_.emplace_back();
  r.buf = const_cast<void*>(buf);
  r.len = bytes;
  r.tag = tag;
  r.peer = peer;
  comm_.pair_of_[peer]->isend(&r);
  return &r;
}

Request* Context::irecv(int peer, void* buf, size_t bytes, uint64_t tag) {
  Request& r = reqs_.emplace_back();
  r.buf = buf;
  r.len = bytes;
  r.tag = tag;
  r.peer = peer;
  comm_.pair_of_[peer]->irecv(&r);
  return &r;
}

void Context::check(Request* r) {
  if (r->state != Request::kFailed) return;
  std::string op = describeTag(r->tag);
  if (r->failure == Request::kMismatch) {
    throw Error(Error::kMismatch, "collective mismatch between rank " + std::to_string(rank_) + " and rank " +
                                      std::to_string(r->peer) + ": rank " + std::to_string(rank_) + " called " +
                                      op + " expecting " + std::to_string(r->len) + " bytes, rank " +
                                      std::to_string(r->peer) + " sent " + describeTag(r->peer_tag) + " with " +
                                      std::to_string(r->peer_len) + " bytes");
  }
  // A peer that found a mismatch aborts with that text: keep the kind, so every
  // rank raises the same class of error.
  Error::Kind kind = r->error.find("collective mismatch") != std::string::npos ? Error::kMismatch : Error::kPeerFailure;
  if (r->failure == Request::kLocal) kind = Error::kInvalidArgument;  // our own buffer, not the peer
  throw Error(kind, std::string(collName(args_.coll)) + " on rank " + std::to_string(rank_) + " failed: " + r->error);
}

void Context::wait(Request* r) { waitAll({r}); }

void Context::waitAll(std::initializer_list<Request*> rs) { waitAll(std::vector<Request*>(rs)); }

void Context::waitAll(const std::vector<Request*>& rs) {
  const int kSpin = comm_.spin_;
  Deadline dl = Deadline::after(timeout_s_);
  int idle = 0;
  auto& transports = comm_.transports_;
  for (;;) {
    bool all = true;
    for (Request* r : rs) {
      if (!r->done()) all = false;
      else check(r);
    }
    if (all) return;
    bool moved = false;
    for (auto& t : transports) moved |= t->progress();
    if (moved) {
      idle = 0;
      continue;
    }
    ++idle;
    if (idle < kSpin) continue;
    if (idle < 2 * kSpin) {
      sched_yield();
      continue;
    }
    if (dl.passed()) {
      std::string peers;
      for (Request* r : rs)
        if (!r->done()) peers += (peers.empty() ? "" : ", ") + std::to_string(r->peer);
      throw Error(Error::kTimeout, describeTag(tag_) + " on rank " + std::to_string(rank_) + " timed out after " +
                                       std::to_string(static_cast<int>(timeout_s_)) +
                                       " s waiting for rank(s) " + peers +
                                       " (a rank is stuck, dead, or did not call this collective)");
    }
    // Block on the transport(s) that hold the pending requests.
    transport::Transport* only = nullptr;
    bool several = false;
    for (Request* r : rs) {
      if (r->done()) continue;
      transport::Transport* t = comm_.transport_of_[r->peer];
      if (only && t != only) several = true;
      only = t;
    }
    int slice = std::min(dl.remainingMs(), 200);
    if (several) {
      for (auto& t : transports) t->wait(0);
      sched_yield();
    } else if (only) {
      only->wait(std::max(slice, 1));
    }
    idle = 2 * kSpin;  // after a block: poll once, then block again
  }
}

void Context::sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes) {
  Request* s = isend(to, sbuf, sbytes);
  Request* r = irecv(from, rbuf, rbytes);
  waitAll({s, r});
}

transport::Transport* Context::transportOf(int peer) const { return comm_.transport_of_.at(peer); }

void* Context::scratch(size_t bytes) {
  if (comm_.scratch_.size() < bytes) comm_.scratch_.resize(bytes);
  return comm_.scratch_.data();
}

size_t Context::segmentBytes() const { return comm_.segment_bytes_; }

}  // namespace harp
