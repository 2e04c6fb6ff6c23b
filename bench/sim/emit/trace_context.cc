// bench/sim/emit/trace_context.cc — a second definition of harp::Context
// (core/engine/context.h) for harp_sched: the same class, linked instead of
// core/engine/context.cc, so HARP's algorithm files run unchanged while every
// isend/irecv/wait they issue lands in the current Schedule (schedule.h).
//
// Every request completes at once and no byte moves: a rank runs alone, its
// receives hold whatever the buffer held. That is sound for the collectives
// harp_sched emits (fixed-size allreduce: which messages go where, and how
// large, depends on count, p and the segment size, never on the data) and
// wrong for data-dependent ones (top-k), which harp_sched refuses.
//
// Frames: a Context runs on the global ranks of its frame (the whole
// communicator, or one sub-communicator of a hierarchical algorithm, see
// trace_groups.cc); peers are mapped to global ranks and tagged with the
// frame's comm number.
#include <stdexcept>
#include <unordered_map>

#include "bench/sim/emit/frames.h"
#include "bench/sim/emit/schedule.h"
#include "core/engine/context.h"

namespace harp {
namespace {
std::unordered_map<const Context*, sim::Frame>& frames() {
  static std::unordered_map<const Context*, sim::Frame> m;
  return m;
}
const sim::Frame& frameOf(const Context* c) { return frames().at(c); }
}  // namespace

Context::Context(CommResources& res, int rank, int size, const CollArgs& args, uint64_t tag, double timeout_s)
    : res_(res), args_(args), tag_(tag), timeout_s_(timeout_s), rank_(rank), size_(size),
      esize_(dtypeSize(args.dtype)), settle_n_(0) {
  frames()[this] = sim::takeNextFrame(size);
}

Context::~Context() { frames().erase(this); }

Request* Context::isend(int peer, const void* buf, size_t bytes) { return isend(peer, buf, bytes, tag_); }
Request* Context::irecv(int peer, void* buf, size_t bytes) { return irecv(peer, buf, bytes, tag_); }

static Request* post(std::optional<std::deque<Request>>& reqs, const sim::Frame& f, char kind, int rank, int size,
                     int peer, const void* buf, size_t bytes, uint64_t tag) {
  if (peer < 0 || peer >= size || peer == rank)
    throw std::logic_error("harp_sched: rank " + std::to_string(rank) + " posted to peer " + std::to_string(peer) +
                           " of " + std::to_string(size));
  if (!reqs) reqs.emplace();
  Request& r = reqs->emplace_back();
  r.buf = const_cast<void*>(buf);
  r.len = bytes;
  r.tag = tag;
  r.peer = peer;
  r.tp_word = sim::current().post(kind, f.ranks[peer], bytes, f.comm);
  r.state = Request::kDone;
  return &r;
}

Request* Context::isend(int peer, const void* buf, size_t bytes, uint64_t tag, bool) {
  return post(reqs_, frameOf(this), 'S', rank_, size_, peer, buf, bytes, tag);
}

Request* Context::irecv(int peer, void* buf, size_t bytes, uint64_t tag) {
  return post(reqs_, frameOf(this), 'V', rank_, size_, peer, buf, bytes, tag);
}

void Context::wait(Request* r) { waitAll({r}); }

void Context::waitAll(std::initializer_list<Request*> rs) { waitAll(std::vector<Request*>(rs)); }

void Context::waitAll(const std::vector<Request*>& rs) {
  std::vector<uint32_t> ids;
  ids.reserve(rs.size());
  for (Request* r : rs)
    if (r) ids.push_back(static_cast<uint32_t>(r->tp_word));
  sim::current().wait(std::move(ids));
}

void Context::sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes) {
  Request* s = isend(to, sbuf, sbytes);
  Request* r = irecv(from, rbuf, rbytes);
  waitAll({s, r});
}

// Scratch is one reserved region for every Context (nothing reads data in a
// trace, so legs may share it): copies into it are recorded (trace_memory.cc).
void* Context::scratch(size_t bytes) {
  constexpr size_t kRoom = size_t{1} << 42;
  static void* room = sim::reserveRegion(kRoom);
  if (bytes > kRoom) throw std::runtime_error("harp_sched: scratch of " + std::to_string(bytes) + " bytes");
  return room;
}
size_t Context::segmentBytes() const { return res_.segment_bytes; }
transport::Transport* Context::transportOf(int) const { return nullptr; }
SubComms& Context::subComms() { return sim::subCommsOf(frameOf(this)); }

}  // namespace harp
