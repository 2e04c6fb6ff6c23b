// bindings/python_module.cc — the `harp._harp` extension: a thin, pointer-based
// layer over core/. Buffers arrive as integer addresses (numpy, torch, cupy
// and the NCCL-style API all have them); python/harp/ turns arrays into
// pointers, checks shapes and keeps buffers alive for async work. `Comm.run`
// and `Comm.submit` take raw addresses and counts: the caller (comm.py, the
// torch backend) owns that count x dtypeSize(dtype) fits each buffer and that
// the buffers live until the work completes. run_arrays takes arrays and
// derives both itself.
//
// The GIL is released while a collective runs or is waited for. C++ errors
// become the exception classes of harp.errors (by harp::Error::Kind).
#include <optional>

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/algorithms/registry.h"
#include "bootstrap/bootstrap.h"
#include "base/log.h"
#include "core/engine/communicator.h"
#include "core/compress/compress.h"
#include "core/observe/jobview.h"
#include "core/observe/recorder.h"
#include "core/select/cost.h"
#include "core/select/select.h"
#include "base/reduce.h"
#include "transport/transport.h"

namespace py = pybind11;
using namespace harp;

namespace {

// base/vocab.def as data, for harp._types: {"dtypes": [(name, value, itemsize, numpy name, NCCL value)],
// "dtype_aliases": [(alias, name)], "ops": [(name, value, Python name)], "op_aliases": [(alias,
// name)], "colls": [(name, value, reduces, rooted, vcounts, send, recv, inplace, torch)]}, each list
// in vocab.def's order (send, recv, inplace and torch as vocab.def spells them).
// Built from the same X-macro lines as the C++ enums, so Python needs no edit for a new entry.
py::dict vocabTables() {
  py::list dtypes, dtype_aliases, ops, op_aliases, colls;
#define HARP_DTYPE(name, e, value, size, np, nccl, ncclv, integer, torch) \
  dtypes.append(py::make_tuple(#name, value, size, #np, ncclv));
#define HARP_DTYPE_ALIAS(alias, name) dtype_aliases.append(py::make_tuple(#alias, #name));
#define HARP_REDOP(name, e, value, pyname, nccl, ncclv) ops.append(py::make_tuple(#name, value, #pyname));
#define HARP_REDOP_ALIAS(alias, name) op_aliases.append(py::make_tuple(#alias, #name));
#define HARP_COLL(name, e, value, reduces, rooted, vcounts, send, recv, inplace, torch) \
  colls.append(py::make_tuple(#name, value, bool(reduces), bool(rooted), bool(vcounts), #send, #recv, #inplace, \
                              #torch));
#include "base/vocab.def"
  py::dict out;
  out["dtypes"] = dtypes;
  out["dtype_aliases"] = dtype_aliases;
  out["ops"] = ops;
  out["op_aliases"] = op_aliases;
  out["colls"] = colls;
  return out;
}

// A Store implemented in Python (the torch backend wraps torch's c10d Store).
class PyStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire g;
    PYBIND11_OVERRIDE_PURE(void, Store, set, key, py::bytes(value));
  }
  std::string get(const std::string& key, double timeout_s) override {
    py::gil_scoped_acquire g;
    py::function f = py::get_override(static_cast<const Store*>(this), "get");
    if (!f) throw Error(Error::kInternal, "Python store has no get()");
    py::object v = f(key, timeout_s);
    return v.cast<std::string>();
  }
  int64_t add(const std::string& key, int64_t delta) override {
    py::gil_scoped_acquire g;
    PYBIND11_OVERRIDE_PURE(int64_t, Store, add, key, delta);
  }
};

// What from_store hands the core for a store implemented in Python: the C++
// side of a Python object lives only as long as that object, and the core keeps
// using its store after creation (hierarchical sub-communicators, split, agree,
// shrink), often after the caller dropped its reference ("Tried to call pure
// virtual function Store::add"). This holds a reference to the Python object
// for as long as any communicator holds the store; released under the GIL (and
// leaked, not released, once the interpreter is finalizing).
class PyStoreRef : public Store {
 public:
  PyStoreRef(std::shared_ptr<Store> s, py::object o) : s_(std::move(s)), o_(new py::object(std::move(o))) {}
  ~PyStoreRef() override {
    if (!Py_IsInitialized()) return;  // interpreter gone: leak the reference
    py::gil_scoped_acquire g;
    delete o_;
  }
  void set(const std::string& key, const std::string& value) override { s_->set(key, value); }
  std::string get(const std::string& key, double timeout_s) override { return s_->get(key, timeout_s); }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }

 private:
  std::shared_ptr<Store> s_;
  py::object* o_;
};

void translate(const Error& e) {
  static const char* names[] = {"InvalidArgumentError", "MismatchError", "PeerError", "HarpTimeoutError",
                                "HarpError", "UnavailableError", "HarpError", "RevokedError"};
  py::object cls = py::module_::import("harp.errors").attr(names[e.kind()]);
  PyErr_SetString(cls.ptr(), e.what());
}

// The arguments every collective call from Python carries.
CollArgs collArgs(int coll, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root) {
  CollArgs a;
  a.coll = static_cast<CollType>(coll);
  a.sendbuf = reinterpret_cast<const void*>(send);
  a.recvbuf = reinterpret_cast<void*>(recv);
  a.count = count;
  a.dtype = static_cast<DataType>(dtype);
  a.op = static_cast<ReduceOp>(op);
  a.root = root;
  return a;
}

// numpy type number -> HARP datatype, -1 where HARP has none (the general
// Python path then names the problem). Values from numpy's NPY_TYPES.
int dtypeOfNumpy(int num) {
  switch (num) {
    case 0: return static_cast<int>(DataType::kBool);      // NPY_BOOL
    case 1: return static_cast<int>(DataType::kInt8);      // NPY_BYTE
    case 2: return static_cast<int>(DataType::kUint8);     // NPY_UBYTE
    case 5: return static_cast<int>(DataType::kInt32);     // NPY_INT
    case 6: return static_cast<int>(DataType::kUint32);    // NPY_UINT
    case 7: case 9: return static_cast<int>(DataType::kInt64);    // NPY_LONG, NPY_LONGLONG (LP64)
    case 8: case 10: return static_cast<int>(DataType::kUint64);  // NPY_ULONG, NPY_ULONGLONG
    case 11: return static_cast<int>(DataType::kFloat32);  // NPY_FLOAT
    case 12: return static_cast<int>(DataType::kFloat64);  // NPY_DOUBLE
    case 23: return static_cast<int>(DataType::kFloat16);  // NPY_HALF
    default: return -1;
  }
}

// A numpy array usable as-is by the fast path: exactly ndarray, C-contiguous,
// a HARP dtype, writable when asked. Anything else returns false and the
// Python layer handles it (and words the error, if there is one).
bool plainArray(PyObject* o, bool writable, void** data, size_t* count, int* dtype) {
  if (!py::isinstance<py::array>(o)) return false;
  auto a = py::reinterpret_borrow<py::array>(o);
  if (!(a.flags() & py::array::c_style) || (writable && !a.writeable())) return false;
  // The type number ignores byte order: a byte-swapped array ('>f4' here) must
  // take the general path, which refuses it, not be reduced as native floats.
  const char order = a.dtype().byteorder();
  if (order != '=' && order != '|') return false;
  *dtype = dtypeOfNumpy(a.dtype().num());
  if (*dtype < 0) return false;
  *data = const_cast<void*>(a.data());
  *count = static_cast<size_t>(a.size());
  return true;
}

// The reduction op of a fast-path call: an exact int (an IntEnum ReduceOp
// included) in range, or one of the op names, spelt exactly. -1 for anything
// else (bool, float, numpy scalars, other spellings): the general Python path
// then accepts or words the error. bool is an int subclass, so it is refused
// explicitly (op=True must not mean prod).
long opCode(PyObject* op) {
  static const char* const kNames[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  if (PyUnicode_Check(op)) {
    for (long i = 0; i < 8; ++i)
      if (PyUnicode_CompareWithASCIIString(op, kNames[i]) == 0) return i;
    return -1;
  }
  if (!PyLong_Check(op) || PyBool_Check(op)) return -1;
  const long v = PyLong_AsLong(op);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  return v >= 0 && v < 8 ? v : -1;
}

// The fastest call path, for blocking collectives on numpy arrays:
// _harp.run_arrays(comm, coll, send, recv, op, root, algo) checks the arrays
// here instead of in Python and starts the collective. `op` is the caller's
// op object (see opCode), `root` an exact int (not bool). The element counts
// come from the arrays themselves (no dtype override here), so count x itemsize
// is each array's size by construction. allreduce, broadcast,
// reduce: `recv` None means in place. allgather, reduce_scatter, alltoall:
// `recv` is required. The arrays' sizes must relate as vocab.def's byte rule
// says (allgather's recv N times send's, ...; an unused side is ignored). `algo`
// is a name or None. Returns False, doing nothing, when the arguments need the
// general path (not a plain C-contiguous ndarray of a HARP dtype, or sizes or
// dtypes that do not fit), which also words any error.
// A raw METH_FASTCALL function, not a pybind11 one: pybind11's dispatcher cost
// about as much as the whole 2-rank shared-memory allreduce (~0.8 us).
PyObject* runArrays(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "run_arrays(comm, coll, send, recv, op, root, algo) takes 7 arguments");
    return nullptr;
  }
  try {
    Communicator& c = py::cast<Communicator&>(py::handle(args[0]));
    const long op = opCode(args[4]);
    if (op < 0 || !PyLong_CheckExact(args[5])) Py_RETURN_FALSE;
    const long coll = PyLong_AsLong(args[1]);
    if (PyErr_Occurred()) return nullptr;
    // A root beyond a C long (root=2**63) is out of range like any other: the general path
    // words the error (InvalidArgumentError naming root), not an OverflowError from here.
    int overflow = 0;
    const long long root = PyLong_AsLongLongAndOverflow(args[5], &overflow);
    if (overflow || root < 0 || root >= c.size()) Py_RETURN_FALSE;
    // The numpy API's own choice, not a collective trait: `recv` None means in place for
    // allreduce, broadcast and reduce; the others need a receive array here (comm.py makes one
    // before calling when the user passed none). gather, scatter and the rest take the general path.
    const CollType ct = static_cast<CollType>(coll);
    const bool none_in_place = ct == CollType::kAllreduce || ct == CollType::kBroadcast || ct == CollType::kReduce;
    if (!none_in_place && ct != CollType::kAllgather && ct != CollType::kReduceScatter && ct != CollType::kAlltoall)
      Py_RETURN_FALSE;
    const bool inPlace = args[3] == Py_None;
    if (inPlace && !none_in_place) Py_RETURN_FALSE;
    // The byte rule (vocab.def): blocks of `count` elements each array holds on this rank (0: unused
    // here), so count follows from the send array (or the receive array when this rank sends none).
    const size_t N = static_cast<size_t>(c.size());
    const bool at_root = c.rank() == root;
    const size_t kb_send = bufferBlocks(collSend(ct), N, at_root), kb_recv = bufferBlocks(collRecv(ct), N, at_root);
    void *s = nullptr, *r = nullptr;
    size_t ns = 0, nr = 0, count = 0;
    int ds = 0, dr = 0;
    bool ok;
    // k: blocks in the array count is read from (send's, or recv's where this rank sends none).
    const size_t k = kb_send ? kb_send : kb_recv;
    if (inPlace) {  // one array for both buffers: written when this rank receives
      ok = plainArray(args[2], kb_recv > 0, &s, &ns, &ds) && k && ns % k == 0;
      count = k ? ns / k : 0;
      if (kb_recv) r = s, nr = ns;
    } else {
      ok = plainArray(args[2], false, &s, &ns, &ds) && plainArray(args[3], true, &r, &nr, &dr) && dr == ds;
      const size_t n = kb_send ? ns : nr;
      count = k ? n / k : 0;
      ok = ok && k && n % k == 0 && (!kb_recv || nr == count * kb_recv);
      if (!kb_recv) r = nullptr, nr = 0;  // unused on this rank (a reduce's non-root)
    }
    if (!ok) Py_RETURN_FALSE;
    CollArgs a = collArgs(static_cast<int>(coll), reinterpret_cast<uintptr_t>(ns ? s : nullptr),
                          reinterpret_cast<uintptr_t>(nr ? r : nullptr), count, ds, static_cast<int>(op),
                          static_cast<int>(root));
    if (args[6] != Py_None) {
      Py_ssize_t len = 0;
      const char* name = PyUnicode_AsUTF8AndSize(args[6], &len);
      if (!name) return nullptr;
      a.opts.algo.assign(name, static_cast<size_t>(len));
    }
    {
      py::gil_scoped_release nogil;
      c.run(std::move(a));
    }
    Py_RETURN_TRUE;
  } catch (const Error& e) {
    translate(e);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "run_arrays: first argument must be a harp._harp.Comm");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef kRunArraysDef = {"run_arrays", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(runArrays)),
                             METH_FASTCALL, "Blocking collective on plain numpy arrays (see bindings/python_module.cc)"};

std::vector<size_t> toSizes(const std::vector<long long>& v) { return {v.begin(), v.end()}; }

}  // namespace

PYBIND11_MODULE(_harp, m) {
  m.doc() = "HARP core bindings (pointer-based; use the harp package API)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      translate(e);
    }
  });

  m.def("get_unique_id", [](const std::string& bind) {
    UniqueId id = createUniqueId(bind);
    return py::bytes(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
  }, py::arg("bind") = "");
  m.def("make_unique_id", [](const std::string& addr, const std::string& secret) {
    UniqueId id = UniqueId::make(SockAddr::parse(addr, 0), secret);
    return py::bytes(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
  });
  m.def("unique_id_address", [](const std::string& b) { return UniqueId::fromBytes(b.data(), b.size()).address().str(); });
  m.def("ensure_store_server", [](const std::string& addr, const std::string& secret) {
    ensureStoreServer(SockAddr::parse(addr, 0), secret);
  });
  m.def("release_unique_id", [](const std::string& b) {
    return releaseStoreServer(UniqueId::fromBytes(b.data(), b.size()));
  });
  m.def("drop_unique_id", [](const std::string& b) { return dropUniqueId(UniqueId::fromBytes(b.data(), b.size())); });
  m.def("store_servers_running", &storeServersRunning);
  m.add_object("run_arrays", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kRunArraysDef, nullptr, m.ptr())));
  // One line through HARP's logger (base/log.h: HARP_DEBUG level, "HARP host:pid [rank] LEVEL"
  // prefix, one write(2)), for the Python side's warnings. level: 1 WARN, 2 INFO, 3 TRACE.
  m.def("log", [](int level, const std::string& msg) {
    if (level < 1 || level > 3) throw InvalidArgument("harp log level must be 1 (WARN), 2 (INFO) or 3 (TRACE), got " + std::to_string(level));
    const LogLevel l = static_cast<LogLevel>(level);
    if (logEnabled(l, LogSubsys::kMisc)) logf(l, "%s", msg.c_str());
  }, py::arg("level"), py::arg("msg"));
  m.def("dtype_size", [](int dt) { return dtypeSize(static_cast<DataType>(dt)); });
  m.def("vocab", &vocabTables, "base/vocab.def as Python data (harp._types builds its classes from it)");
  m.def("reduce_kernel", &reduceKernelName);
  m.def("algorithms", [](const std::string& coll) { return algorithmList(parseColl(coll)); });
  // Algorithm choice, as Communicator::algorithmFor makes it (core/select/select.h), with
  // every candidate: harp-config --explain.
  m.def(
      "explain",
      [](const std::string& coll, size_t bytes, int ranks, const std::string& transport, const std::string& dtype,
         const std::string& op, bool in_place, const std::string& algo, int hosts, int min_local, int max_local) {
        SelectQuery q;
        if (hosts < 1 || min_local < 1 || max_local < min_local)
          throw InvalidArgument("--hosts and --ppn must be >= 1");
        q.hosts = hosts;  // Topology
        q.min_local = min_local;
        q.max_local = max_local;
        q.blocked = true;  // hosts x ppn: each host's ranks consecutive, as launchers place them
        q.coll = parseColl(coll);
        q.bytes = bytes;
        q.count = bytes / dtypeSize(parseDtype(dtype));
        if (ranks < 1) throw InvalidArgument("--ranks must be >= 1");
        q.ranks = ranks;
        q.transport = transport;
        q.in_place = in_place;
        q.op = parseOp(op);
        q.user_algo = algo;
        Selection s = explainAlgorithm(q);
        py::list cands;
        for (const Candidate& c : s.candidates)
          cands.append(py::dict(py::arg("name") = c.algo->name, py::arg("index") = c.algo->index,
                                py::arg("restrictions") = restrictionText(c.algo->restrictions),
                                py::arg("failed") = c.failed, py::arg("seconds") = c.seconds,
                                py::arg("fallback") = c.algo->fallback ? c.algo->fallback : ""));
        return py::dict(py::arg("pick") = s.pick->name, py::arg("source") = pickSourceName(s.source),
                        py::arg("reason") = s.reason(), py::arg("candidates") = cands,
                        py::arg("alpha") = s.params.alpha, py::arg("beta") = s.params.beta,
                        py::arg("gamma") = s.params.gamma, py::arg("overhead") = messageOverhead(s.params),
                        py::arg("link_beta") = s.params.link_beta, py::arg("params_source") = s.params_source,
                        py::arg("count") = q.count);
      },
      py::arg("coll"), py::arg("bytes"), py::arg("ranks"), py::arg("transport"), py::arg("dtype") = "float32",
      py::arg("op") = "sum", py::arg("in_place") = false, py::arg("algo") = "", py::arg("hosts") = 1,
      py::arg("min_local") = 1, py::arg("max_local") = 1);
  m.def("registry_problems", &registryProblems);
  m.def("measure_gamma", &measureGamma);
  m.def("transports", [] {
    std::vector<std::tuple<std::string, int, std::string>> out;
    for (const auto& s : transport::registeredTransports())
      out.emplace_back(s.name, s.priority, s.unavailable ? s.unavailable() : "");
    return out;
  });
  // [(name, path, loaded, why_not)] for each optional transport module (harp-config).
  m.def("transport_modules", [] {
    std::vector<std::tuple<std::string, std::string, bool, std::string>> out;
    for (const auto& mod : transport::transportModules()) out.emplace_back(mod.name, mod.path, mod.loaded, mod.error);
    return out;
  });
  m.def("host_id", [] { return thisHost().host_id; });
  // Local reduction, for tests of the kernels themselves.
  m.def("reduce_local", [](uintptr_t out, uintptr_t a, uintptr_t b, size_t n, int dt, int op) {
    checkOpSupported(static_cast<DataType>(dt), static_cast<ReduceOp>(op));
    py::gil_scoped_release nogil;
    reduce(reinterpret_cast<void*>(out), reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b), n,
           static_cast<DataType>(dt), static_cast<ReduceOp>(op));
  });

  py::class_<Store, PyStore, std::shared_ptr<Store>>(m, "Store")
      .def(py::init<>())
      .def("set", &Store::set)
      .def("get", &Store::get)
      .def("add", &Store::add);

  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", [](Work& w, double t) {
        py::gil_scoped_release nogil;
        return w.wait(t);
      }, py::arg("timeout") = -1.0)
      .def("test", &Work::test)
      .def("failed", &Work::failed)
      .def("error", &Work::error);

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Comm")
      .def(py::init([](const std::string& id, int rank, int size, double timeout, const std::string& transport) {
             CommOptions o;
             o.timeout_s = timeout;
             o.transport = transport;
             UniqueId uid = UniqueId::fromBytes(id.data(), id.size());
             py::gil_scoped_release nogil;
             return Communicator::create(uid, rank, size, o);
           }),
           py::arg("unique_id"), py::arg("rank"), py::arg("size"), py::arg("timeout") = -1.0,
           py::arg("transport") = "")
      .def_static("from_store", [](py::object store_obj, const std::string& prefix, int rank, int size,
                                   double timeout, const std::string& transport) {
             std::shared_ptr<Store> store = store_obj.cast<std::shared_ptr<Store>>();
             if (dynamic_cast<PyStore*>(store.get())) store = std::make_shared<PyStoreRef>(store, store_obj);
             CommOptions o;
             o.timeout_s = timeout;
             o.transport = transport;
             // Python stores re-take the GIL inside; release it so other threads run.
             py::gil_scoped_release nogil;
             return Communicator::create(std::make_shared<PrefixStore>(store, prefix), rank, size, o);
           },
           py::arg("store"), py::arg("prefix"), py::arg("rank"), py::arg("size"), py::arg("timeout") = -1.0,
           py::arg("transport") = "")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("timeout", &Communicator::timeout)
      .def("transport_name", &Communicator::transportName)
      .def("payload_mac", [](const Communicator& c, const std::string& label, py::bytes msg) {
        return py::bytes(c.payloadMac(label, std::string(msg)));
      }, "HMAC-SHA256 of msg under a key derived from the communicator's token and label (Communicator::payloadMac)")
      // Lean blocking path for the common collectives (no p2p, no v-counts, no
      // per-call timeout): fewer argument conversions on every call.
      .def("run",
           [](Communicator& c, int coll, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root,
              const std::string& algo) {
             CollArgs a = collArgs(coll, send, recv, count, dtype, op, root);
             a.opts.algo = algo;
             py::gil_scoped_release nogil;
             c.run(std::move(a));
           })
      .def("submit",
           [](Communicator& c, int coll, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root,
              int peer, uint32_t tag, const std::string& algo, double timeout, bool async,
              const std::vector<long long>& sendcounts, const std::vector<long long>& sdispls,
              const std::vector<long long>& recvcounts, const std::vector<long long>& rdispls) {
             CollArgs a = collArgs(coll, send, recv, count, dtype, op, root);
             a.peer = peer;
             a.tag = tag;
             a.opts.algo = algo;
             a.opts.timeout_s = timeout;
             a.sendcounts = toSizes(sendcounts);
             a.sdispls = toSizes(sdispls);
             a.recvcounts = toSizes(recvcounts);
             a.rdispls = toSizes(rdispls);
             py::gil_scoped_release nogil;
             return c.submit(std::move(a), async);
           },
           py::arg("coll"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op") = 0,
           py::arg("root") = 0, py::arg("peer") = -1, py::arg("tag") = 0, py::arg("algo") = "",
           py::arg("timeout") = -1.0, py::arg("async_op") = false, py::arg("sendcounts") = std::vector<long long>{},
           py::arg("sdispls") = std::vector<long long>{}, py::arg("recvcounts") = std::vector<long long>{},
           py::arg("rdispls") = std::vector<long long>{})
      .def("submit_coalesced",
           [](Communicator& c, const std::vector<uintptr_t>& sends, const std::vector<uintptr_t>& recvs,
              const std::vector<size_t>& counts, int dtype, int op, const std::string& algo, double timeout,
              bool async) {
             if (sends.size() != counts.size() || recvs.size() != counts.size())
               throw InvalidArgument("submit_coalesced: sends, recvs and counts differ in length");
             std::vector<BufPiece> pieces(counts.size());
             for (size_t i = 0; i < counts.size(); ++i)
               pieces[i] = {reinterpret_cast<const void*>(sends[i]), reinterpret_cast<void*>(recvs[i]), counts[i]};
             CollOptions o;
             o.algo = algo;
             o.timeout_s = timeout;
             py::gil_scoped_release nogil;
             return c.allreduceCoalesced(std::move(pieces), static_cast<DataType>(dtype), static_cast<ReduceOp>(op),
                                         std::move(o), async);
           },
           py::arg("sends"), py::arg("recvs"), py::arg("counts"), py::arg("dtype"), py::arg("op") = 0,
           py::arg("algo") = "", py::arg("timeout") = -1.0, py::arg("async_op") = false)
      .def(
          "choose_algorithm",
          [](Communicator& c, int coll, size_t count, int dtype, const std::string& algo) {
            CollArgs a;
            a.coll = static_cast<CollType>(coll);
            a.count = count;
            a.dtype = static_cast<DataType>(dtype);
            a.opts.algo = algo;
            return c.chooseAlgorithm(a);
          },
          py::arg("coll"), py::arg("count"), py::arg("dtype"), py::arg("algo") = "")
      .def("last_algorithm", [](Communicator& c, int coll) { return c.lastAlgorithm(static_cast<CollType>(coll)); })
      .def("split", [](Communicator& c, int color, int key) {
        py::gil_scoped_release nogil;
        return c.split(color, key);
      })
      .def("abort", [](Communicator& c, const std::string& why) {
        py::gil_scoped_release nogil;
        c.abort(why);
      }, py::arg("reason") = "abort requested")
      .def("destroy", [](Communicator& c) {
        py::gil_scoped_release nogil;
        c.destroy();
      })
      .def_property_readonly("broken", &Communicator::broken);

  // Topology: the communicator's host map (core/topology/topology.h), for
  // harp.topology (python/harp/topology.py).
  m.def("topology", [](Communicator& c) {
    const Topology& t = c.topology();
    py::list hosts, rails;
    for (size_t h = 0; h < t.ranks_of.size(); ++h) {
      std::vector<std::string> nics;
      for (int r : t.ranks_of[h]) nics.push_back(t.nics[r]);
      hosts.append(py::dict(py::arg("host") = h, py::arg("hostname") = t.hostnames[h], py::arg("key") = t.host_ids[h],
                            py::arg("ranks") = t.ranks_of[h], py::arg("nics") = nics));
    }
    for (int i = 0; i < t.max_local; ++i) rails.append(t.rail(i));
    return py::dict(py::arg("rank") = c.rank(), py::arg("size") = c.size(), py::arg("hosts") = hosts,
                    py::arg("host_of") = t.host_of, py::arg("local_rank") = t.local_rank_of,
                    py::arg("rails") = rails, py::arg("leaders") = t.leaders(), py::arg("text") = t.describe());
  });
  // --- Wire compression (core/compress/compress.h) ---
  m.def("compress_submit",
        [](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op,
           const std::string& spec, const std::string& key, const std::string& algo, double timeout, bool async) {
          CollArgs a = collArgs(static_cast<int>(CollType::kAllreduce), send, recv, count, dtype, op, 0);
          a.opts.algo = algo;
          a.opts.timeout_s = timeout;
          if (!spec.empty()) a.compress = parseCompressSpec(spec, "compress");  // "": HARP_COMPRESS
          a.compress.key = key;
          py::gil_scoped_release nogil;
          return c.submit(std::move(a), async);
        },
        py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
        py::arg("spec"), py::arg("key") = "", py::arg("algo") = "", py::arg("timeout") = -1.0,
        py::arg("async_op") = false);
  m.def("compress_spec", [](const std::string& spec) { return compressSpecText(parseCompressSpec(spec, "compress")); });
  m.def("compress_stats", [](Communicator& c) {
    CompressEngine& e = c.compression();
    py::dict d;
    d["bytes_sent"] = e.bytes_sent.load();
    d["compressed_calls"] = e.compressed_calls.load();
    d["dense_calls"] = e.dense_calls.load();
    d["residual_bytes"] = e.residualBytes();
    d["default"] = compressSpecText(e.defaultSpec());
    return d;
  });
  m.def("compress_residual", [](Communicator& c, const std::string& key) {
    std::vector<float> v = c.compression().residualCopy(key);
    return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  });
  m.def("compress_clear", [](Communicator& c, const std::string& key) { c.compression().clearResiduals(key); },
        py::arg("comm"), py::arg("key") = "");
  // Kernels, for tests: narrow (n floats -> n uint16), widen, add (dst = a + widen(b)).
  m.def("compress_kernel", [](const std::string& kind, const std::string& what, uintptr_t dst, uintptr_t a,
                              uintptr_t b, size_t n, const std::string& isa) {
    const CompressSpec s = parseCompressSpec(kind, "kind");
    const NarrowKernels& k = narrowKernels(s.kind, isa);
    if (what == "narrow") k.narrow(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const float*>(a), n);
    else if (what == "widen") k.widen(reinterpret_cast<float*>(dst), reinterpret_cast<const uint16_t*>(a), n);
    else if (what == "add")
      k.add(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(a), reinterpret_cast<const uint16_t*>(b), n);
    else throw InvalidArgument("compress_kernel: narrow, widen or add");
    return std::string(k.isa);
  });
  // Fault tolerance: revoke / agree / shrink / grow (core/engine/communicator_ft.cc).
  auto comm_cls = py::reinterpret_borrow<py::class_<Communicator, std::shared_ptr<Communicator>>>(m.attr("Comm"));
  comm_cls
      .def("revoke", [](Communicator& c) {
        py::gil_scoped_release nogil;
        c.revoke();
      })
      .def_property_readonly("revoked", &Communicator::revoked)
      .def("failed_ranks", &Communicator::failedRanks)
      .def("agree", [](Communicator& c, bool flag) {
        Communicator::Agreement a;
        {
          py::gil_scoped_release nogil;
          a = c.agree(flag);
        }
        return py::make_tuple(a.flag, a.failed);
      })
      .def("shrink", [](Communicator& c, std::optional<std::vector<int>> exclude) {
        py::gil_scoped_release nogil;
        return c.shrink(exclude ? &*exclude : nullptr);
      }, py::arg("exclude") = py::none())
      .def("grow", [](Communicator& c, int new_size, std::optional<std::string> id) {
        std::optional<UniqueId> uid;
        if (id) uid = UniqueId::fromBytes(id->data(), id->size());
        py::gil_scoped_release nogil;
        return c.grow(new_size, uid ? &*uid : nullptr);
      }, py::arg("new_size"), py::arg("unique_id") = py::none());
  // --- Root-only arguments: a root's refused arguments reach every rank (Communicator::refuseRooted) ---
  m.def("refuse_rooted", [](Communicator& c, int coll, const std::string& why) {
    if (coll < 0 || coll >= static_cast<int>(kNumCollTypes)) throw InvalidArgument("refuse_rooted: bad collective");
    py::gil_scoped_release nogil;
    c.refuseRooted(static_cast<CollType>(coll), why);
  }, py::arg("comm"), py::arg("coll"), py::arg("why"));
  // --- Observability: flight recorder, status, metrics (core/observe/recorder.h) ---
  m.def("obs_status_json", [] { return obs::statusJson(); },
        "every live communicator of this process (counters, op in flight, metrics) as JSON");
  m.def("obs_status_socket", [] { return obs::statusSocketPath(); }, "this process's status socket ('' when off)");
  m.def("obs_service", [] { obs::ensureService(); }, "start the process-wide observability service now");
  m.def("jobview_listen_fd", [] { return obs::jobview::listenFd(); },
        "the process's job-view listener fd (-1: none yet or off), for tests that count fds");
  m.def("fr_pickle", [](const std::string& reason) { return py::bytes(obs::flightRecordPickle(reason)); },
        py::arg("reason") = "harp.debug");
  m.def("fr_dump", [](const std::string& reason) {
    std::string err, path;
    {
      py::gil_scoped_release nogil;
      path = obs::dumpFlightRecord(reason, &err);
    }
    if (path.empty()) throw Error(Error::kInternal, "flight record not written: " + err);
    return path;
  }, py::arg("reason") = "harp.debug.dump()");
  m.def("obs_pause", [](Communicator& c, bool paused) {
    auto r = c.recorder();
    if (!r) throw InvalidArgument("obs_pause: this communicator has no flight recorder (HARP_FR_ENTRIES=0)");
    r->setPaused(paused);
  }, py::arg("comm"), py::arg("paused"),
        "benchmarks only (bench/recorder_overhead.py): stop or resume recording this communicator's calls");
}
