// bindings/cpp/harp_api.cc — include/harp/harp.h over the engine: each call
// builds the engine's CollArgs and submits it (core/engine/communicator.h);
// engine errors become harp::api::Error of the same kind. Compiled into
// libharp, so a program links one library. It is a binding (like the Python
// module and the NCCL C API) because it sits above the engine and translates
// its vocabulary; the engine never sees the public header.
#include "include/harp/harp.h"

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "bootstrap/bootstrap.h"
#include "core/engine/communicator.h"

namespace harp::api {

// The public enums mirror base/vocab.def value for value; a vocabulary entry
// missing here, or numbered differently, stops the build.
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch)                \
  static_assert(static_cast<int>(DataType::e) == (value) && static_cast<int>(::harp::DataType::e) == (value), \
                "include/harp/harp.h: DataType::" #e " differs from base/vocab.def");
#define HARP_REDOP(name, e, value, py, nccl, ncclv)                     \
  static_assert(static_cast<int>(ReduceOp::e) == (value) && static_cast<int>(::harp::ReduceOp::e) == (value), \
                "include/harp/harp.h: ReduceOp::" #e " differs from base/vocab.def");
#define HARP_ERROR(e, value, py, nccl)                                   \
  static_assert(static_cast<int>(ErrorKind::e) == (value) && static_cast<int>(::harp::Error::e) == (value), \
                "include/harp/harp.h: ErrorKind::" #e " differs from base/vocab.def");
#include "base/vocab.def"
static_assert(static_cast<int>(DataType::kBool) + 1 == static_cast<int>(::harp::kNumDataTypes),
              "include/harp/harp.h: DataType has an entry base/vocab.def lacks");

namespace {

[[noreturn]] void rethrowPublic(const ::harp::Error& e) {
  throw Error(static_cast<ErrorKind>(e.kind()), e.what());
}

// Runs f, turning the engine's errors into the public ones.
template <class F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ::harp::Error& e) {
    rethrowPublic(e);
  }
}

::harp::CollOptions collOptions(const CallOptions& o) {
  ::harp::CollOptions c;
  c.algo = o.algo;
  c.timeout_s = o.timeout_s;
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------
// UniqueId

UniqueId UniqueId::create() {
  return translated([] {
    UniqueId id;
    id.bytes = ::harp::createUniqueId().bytes;
    return id;
  });
}

std::string UniqueId::hex() const {
  ::harp::UniqueId u;
  u.bytes = bytes;
  return u.hex();
}

UniqueId UniqueId::fromHex(const std::string& hex) {
  return translated([&] {
    UniqueId id;
    id.bytes = ::harp::UniqueId::fromHex(hex).bytes;
    return id;
  });
}

// ---------------------------------------------------------------------------
// The handles

struct Work::Impl {
  std::shared_ptr<::harp::Work> work;
};

struct Comm::Impl {
  std::mutex mu;  // `comm` against destroy() through another handle
  std::shared_ptr<::harp::Communicator> comm;
};

namespace detail {
struct Access {
  static Comm wrap(std::shared_ptr<::harp::Communicator> c) {
    Comm h;
    if (!c) return h;
    h.impl_ = std::make_shared<Comm::Impl>();
    h.impl_->comm = std::move(c);
    return h;
  }
  static std::shared_ptr<::harp::Communicator> live(const Comm& h) {
    if (!h.impl_) throw Error(ErrorKind::kInvalidArgument, "harp::api::Comm: empty handle (default-made, or left out by split)");
    std::lock_guard<std::mutex> g(h.impl_->mu);
    if (!h.impl_->comm) throw Error(ErrorKind::kInvalidArgument, "harp::api::Comm: the communicator has been destroyed");
    return h.impl_->comm;
  }
  static std::shared_ptr<::harp::Communicator> take(Comm& h) {
    if (!h.impl_) return nullptr;
    std::lock_guard<std::mutex> g(h.impl_->mu);
    return std::move(h.impl_->comm);
  }
  // Submit one call; a blocking one has finished (or thrown) on return.
  static Work submit(const Comm& h, ::harp::CollArgs a, const CallOptions& o) {
    std::shared_ptr<::harp::Communicator> c = live(h);
    a.opts = collOptions(o);
    Work w;
    w.impl_ = std::make_shared<Work::Impl>();
    w.impl_->work = translated([&] { return c->submit(std::move(a), o.async); });
    return w;
  }
};
}  // namespace detail

using detail::Access;

// ---------------------------------------------------------------------------
// Work

bool Work::wait(double timeout_s) {
  if (!impl_) return true;
  return translated([&] { return impl_->work->wait(timeout_s); });
}

bool Work::test() const { return !impl_ || impl_->work->test(); }
bool Work::failed() const { return impl_ && impl_->work->failed(); }
std::string Work::error() const { return impl_ ? impl_->work->error() : std::string(); }

// ---------------------------------------------------------------------------
// Comm

Comm Comm::create(const UniqueId& id, int rank, int size, const CommOptions& o) {
  return translated([&] {
    ::harp::UniqueId u;
    u.bytes = id.bytes;
    ::harp::CommOptions co;
    co.timeout_s = o.timeout_s;
    co.transport = o.transport;
    return Access::wrap(::harp::Communicator::create(u, rank, size, std::move(co)));
  });
}

Comm::operator bool() const {
  if (!impl_) return false;
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->comm != nullptr;
}

int Comm::rank() const { return Access::live(*this)->rank(); }
int Comm::size() const { return Access::live(*this)->size(); }

namespace {

::harp::CollArgs args(::harp::CollType c, const void* send, void* recv, size_t count, DataType dt) {
  ::harp::CollArgs a;
  a.coll = c;
  a.sendbuf = send;
  a.recvbuf = recv;
  a.count = count;
  a.dtype = static_cast<::harp::DataType>(dt);
  return a;
}

::harp::CollArgs reducing(::harp::CollType c, const void* send, void* recv, size_t count, DataType dt, ReduceOp op) {
  ::harp::CollArgs a = args(c, send, recv, count, dt);
  a.op = static_cast<::harp::ReduceOp>(op);
  return a;
}

::harp::CollArgs rooted(::harp::CollType c, const void* send, void* recv, size_t count, DataType dt, int root) {
  ::harp::CollArgs a = args(c, send, recv, count, dt);
  a.root = root;
  return a;
}

::harp::CollArgs p2p(::harp::CollType c, const void* send, void* recv, size_t count, DataType dt, int peer,
                     uint32_t tag) {
  ::harp::CollArgs a = args(c, send, recv, count, dt);
  a.peer = peer;
  a.tag = tag;
  return a;
}

using CT = ::harp::CollType;

}  // namespace

Work Comm::allreduce(const void* s, void* r, size_t n, DataType dt, ReduceOp op, const CallOptions& o) {
  return Access::submit(*this, reducing(CT::kAllreduce, s, r, n, dt, op), o);
}

Work Comm::broadcast(void* buf, size_t n, DataType dt, int root, const CallOptions& o) {
  return Access::submit(*this, rooted(CT::kBroadcast, buf, buf, n, dt, root), o);
}

Work Comm::reduce(const void* s, void* r, size_t n, DataType dt, ReduceOp op, int root, const CallOptions& o) {
  ::harp::CollArgs a = reducing(CT::kReduce, s, r, n, dt, op);
  a.root = root;
  return Access::submit(*this, std::move(a), o);
}

Work Comm::allgather(const void* s, void* r, size_t n, DataType dt, const CallOptions& o) {
  return Access::submit(*this, args(CT::kAllgather, s, r, n, dt), o);
}

Work Comm::reduce_scatter(const void* s, void* r, size_t n, DataType dt, ReduceOp op, const CallOptions& o) {
  return Access::submit(*this, reducing(CT::kReduceScatter, s, r, n, dt, op), o);
}

Work Comm::alltoall(const void* s, void* r, size_t n, DataType dt, const CallOptions& o) {
  return Access::submit(*this, args(CT::kAlltoall, s, r, n, dt), o);
}

Work Comm::gather(const void* s, void* r, size_t n, DataType dt, int root, const CallOptions& o) {
  return Access::submit(*this, rooted(CT::kGather, s, r, n, dt, root), o);
}

Work Comm::scatter(const void* s, void* r, size_t n, DataType dt, int root, const CallOptions& o) {
  return Access::submit(*this, rooted(CT::kScatter, s, r, n, dt, root), o);
}

Work Comm::barrier(const CallOptions& o) { return Access::submit(*this, args(CT::kBarrier, nullptr, nullptr, 0, DataType::kUint8), o); }

Work Comm::send(const void* buf, size_t n, DataType dt, int peer, uint32_t tag, const CallOptions& o) {
  return Access::submit(*this, p2p(CT::kSend, buf, nullptr, n, dt, peer, tag), o);
}

Work Comm::recv(void* buf, size_t n, DataType dt, int peer, uint32_t tag, const CallOptions& o) {
  return Access::submit(*this, p2p(CT::kRecv, nullptr, buf, n, dt, peer, tag), o);
}

Comm Comm::split(int color, int key) const {
  std::shared_ptr<::harp::Communicator> c = Access::live(*this);
  return translated([&] { return Access::wrap(c->split(color, key)); });
}

void Comm::abort(const std::string& reason) { Access::live(*this)->abort(reason); }

void Comm::destroy() {
  std::shared_ptr<::harp::Communicator> c = Access::take(*this);
  if (c) translated([&] { c->destroy(); });
}

}  // namespace harp::api
