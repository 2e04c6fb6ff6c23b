"""API safety of harp.Communicator, multi-process on tcp and shm.

* dtype= is checked against the buffer: the element count is the buffer's bytes / itemsize, so
  no call reads or writes past a buffer. Every buffer here is a view into the middle of a larger
  allocation whose canary bytes on both sides are checked after the call.
* Async calls own their buffers: handles and temporaries dropped, gc.collect(), new arrays
  allocated and filled over the freed memory; results and the new arrays are checked.
* Meaningless arguments (op=True, op=3.0, root=True, float counts, bad tags and peers) raise
  InvalidArgumentError naming the argument, on every rank.
* A hypothesis test generates argument combinations for every collective and checks each call
  against a model of what is valid: an error naming a bad argument, or the correct result.
"""
import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harp
from harp._types import ITEMSIZE, DataType, numpy_dtype
from harness import run_ranks

TRANSPORTS = ["tcp", "shm"]
ENV = {"HARP_TIMEOUT": "30"}
PAD = 64
CANARY = 0xA5


def _env(transport):
    return {**ENV, "HARP_TRANSPORT": transport}


class Guarded:
    """An array of `n` elements of `dtype` in the middle of a canary-filled allocation."""

    def __init__(self, dtype, n, data=None):
        dtype = np.dtype(dtype)
        self.nbytes = n * dtype.itemsize
        self.raw = np.full(PAD + self.nbytes + PAD, CANARY, np.uint8)
        self.arr = self.raw[PAD:PAD + self.nbytes].view(dtype)
        if data is not None:
            self.fill_bytes(data)

    def fill_bytes(self, b):
        self.raw[PAD:PAD + self.nbytes] = np.frombuffer(b, np.uint8)[:self.nbytes]

    def intact(self):
        return bool((self.raw[:PAD] == CANARY).all() and (self.raw[PAD + self.nbytes:] == CANARY).all())

    def bytes(self):
        return self.raw[PAD:PAD + self.nbytes].tobytes()


# ---------------------------------------------------------------------------------------------------
# Item 4: dtype= against the buffer (the examples, and their neighbours)

def _dtype_override(rank, size):
    comm = harp.init()
    out = {}
    # 1024 bytes read as float64 are 128 elements, not 1024 (which wrote 7 KiB past the array)
    g = Guarded(np.uint8, 1024, np.full(128, rank + 1.0).tobytes())
    comm.allreduce(g.arr, dtype="float64")
    out["allreduce"] = (g.intact(), np.array_equal(np.frombuffer(g.bytes(), np.float64),
                                                     np.full(128, size * (size + 1) / 2)))
    # out-of-place: recvbuf must hold exactly count x itemsize bytes
    s = Guarded(np.uint8, 64, np.arange(16, dtype=np.int32).tobytes())
    r = Guarded(np.float32, 16)
    comm.allreduce(s.arr, r.arr, dtype="int32")
    out["out_of_place"] = (s.intact() and r.intact(),
                           np.array_equal(np.frombuffer(r.bytes(), np.int32), np.arange(16) * size))
    errs = []
    for call in (lambda: comm.allreduce(np.zeros(1023, np.uint8), dtype="float64"),
                 lambda: comm.allreduce(np.zeros(16, np.uint8), np.zeros(8, np.uint8), dtype="float64"),
                 lambda: comm.broadcast(np.zeros(6, np.uint8), dtype="int32"),
                 lambda: comm.allgather(np.zeros(3, np.uint8), dtype="uint32"),
                 lambda: comm.allreduce(np.zeros(8, np.uint8), dtype="complex64"),
                 lambda: comm.allreduce(np.zeros(8, np.uint8), dtype=True),
                 lambda: comm.send(np.zeros(5, np.uint8), (rank + 1) % size, dtype="float32"),
                 lambda: comm.recv(np.zeros(5, np.uint8), (rank + 1) % size, dtype="float32")):
        try:
            call()
            errs.append("no error")
        except harp.InvalidArgumentError as e:
            errs.append(str(e))
    out["errors"] = errs
    # send/recv with dtype=: exactly the buffer's bytes travel
    if size >= 2 and rank < 2:
        if rank == 0:
            comm.send(np.arange(6, dtype=np.int16), 1, dtype="int32")
            out["p2p"] = True
        else:
            r = Guarded(np.uint8, 12)
            comm.recv(r.arr, 0, dtype="int32")
            out["p2p"] = r.intact() and np.array_equal(np.frombuffer(r.bytes(), np.int16), np.arange(6))
    comm.barrier()
    comm.destroy()
    return out


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dtype_override_never_overruns_a_buffer(transport):
    for res in run_ranks(2, _dtype_override, env=_env(transport), timeout=180):
        assert res["allreduce"] == (True, True)
        assert res["out_of_place"] == (True, True)
        assert res["p2p"]
        e = res["errors"]
        assert "not a whole number of dtype=float64" in e[0] and "sendbuf" in e[0], e[0]
        assert "recvbuf has 1 elements, expected 2" in e[1], e[1]
        assert "broadcast: buf" in e[2] and "dtype=int32" in e[2], e[2]
        assert "allgather: sendbuf" in e[3], e[3]
        assert "dtype" in e[4] and "dtype" in e[5], e[4:6]
        assert "send: buf" in e[6] and "recv: buf" in e[7], e[6:]


# ---------------------------------------------------------------------------------------------------
# Item 3: async buffers live until the collective is done, handles dropped or not

SIZES = (1, 1000, 70_001, 300_007)  # small (malloc) and large (mmap) allocations


def _dropped_handles(rank, size, rounds):
    comm = harp.init()
    kept, junk = [], []
    for i in range(rounds):
        n = SIZES[i % len(SIZES)] + i
        out = np.empty(n, np.float64)
        comm.allreduce(np.full(n, float(rank + i)), out, async_op=True)  # temporary send, handle dropped
        comm.allreduce(np.full(n, 1.0), async_op=True)                   # in place on a temporary
        ag = np.empty((size, 3), np.int32)
        comm.allgather(np.full(3, rank * 10 + i, np.int32), ag, async_op=True)
        bc = np.empty(n, np.float32)
        if rank == i % size:
            bc[:] = i
        comm.broadcast(bc, root=i % size, async_op=True)
        rs = np.empty(2, np.int64)
        comm.reduce_scatter(np.full(2 * size, rank + i, np.int64), rs, async_op=True)
        a2a = np.empty(size * 4, np.uint8)
        comm.alltoall(np.full(size * 4, rank, np.uint8), a2a, async_op=True)
        if size >= 2 and rank < 2:  # p2p with a temporary on both sides
            if rank == 0:
                comm.send(np.full(n, i, np.int64), 1, tag=i, async_op=True)
                p2p = None
            else:
                p2p = np.empty(n, np.int64)
                comm.recv(p2p, 0, tag=i, async_op=True)
        else:
            p2p = None
        kept.append((i, n, out, ag, bc, rs, a2a, p2p))
        if i % 4 == 3:
            gc.collect()
            junk.append(np.full(SIZES[i % len(SIZES)] + 7, -7.0))  # takes freed memory back
    gc.collect()
    junk += [np.full(s + k, -7.0) for s in SIZES for k in range(3)]
    comm.barrier()  # blocking: runs after everything queued before it
    bad = []
    tri = size * (size - 1) // 2
    for i, n, out, ag, bc, rs, a2a, p2p in kept:
        if not np.all(out == size * i + tri):
            bad.append(f"allreduce {i}")
        if not np.array_equal(ag, np.array([[r * 10 + i] * 3 for r in range(size)], np.int32)):
            bad.append(f"allgather {i}")
        if not np.all(bc == i):
            bad.append(f"broadcast {i}")
        if not np.all(rs == size * i + tri):
            bad.append(f"reduce_scatter {i}")
        if not np.array_equal(a2a, np.repeat(np.arange(size, dtype=np.uint8), 4)):
            bad.append(f"alltoall {i}")
        if p2p is not None and not np.all(p2p == i):
            bad.append(f"recv {i}")
    if not all(np.all(j == -7.0) for j in junk):
        bad.append("an array allocated after the calls was overwritten")
    comm.destroy()
    return bad


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("nranks", [2, 3])
def test_dropped_async_handles_keep_buffers_alive(transport, nranks):
    res = run_ranks(nranks, _dropped_handles, 24, env=_env(transport), timeout=300)
    assert all(not bad for bad in res), res


def _dropped_communicator(rank, size):
    """The Communicator object itself dropped with async work queued: its buffers still live."""
    comm = harp.init()
    c = comm._c
    outs = []
    for i in range(8):
        out = np.empty(300_007, np.float64)
        comm.allreduce(np.full(300_007, float(rank)), out, async_op=True)
        outs.append(out)
    del comm
    gc.collect()
    junk = [np.full(300_007, -7.0) for _ in range(8)]
    ok = all(np.all(o == size * (size - 1) / 2) for o in outs) and all(np.all(j == -7.0) for j in junk)
    c.destroy()
    return ok


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dropped_communicator_keeps_async_buffers_alive(transport):
    assert all(run_ranks(2, _dropped_communicator, env=_env(transport), timeout=180))


# ---------------------------------------------------------------------------------------------------
# Item 12: meaningless arguments are refused on every rank, naming the argument

BAD_CALLS = [
    ("op", lambda c, x: c.allreduce(x, op=True)),
    ("op", lambda c, x: c.allreduce(x, op=False)),
    ("op", lambda c, x: c.allreduce(x, op=3.0)),
    ("op", lambda c, x: c.allreduce(x, op=None)),
    ("op", lambda c, x: c.allreduce(x, op=[1])),
    ("op", lambda c, x: c.allreduce(x, op=8)),
    ("op", lambda c, x: c.reduce_scatter(np.zeros(c.size, x.dtype), op=True)),
    ("op", lambda c, x: c.reduce(x, op=2.0)),
    ("root", lambda c, x: c.broadcast(x, root=True)),
    ("root", lambda c, x: c.broadcast(x, root=1.0)),
    ("root", lambda c, x: c.reduce(x, root=False)),
    ("root", lambda c, x: c.gather(x, root=np.bool_(True))),
    ("root", lambda c, x: c.scatter(None, x, root=c.size)),
    ("root", lambda c, x: c.broadcast(x, root=-1)),
    ("sendcounts[0]", lambda c, x: c.alltoallv(x, [0.5] * c.size, np.empty_like(x), [0] * c.size)),
    ("recvcounts[0]", lambda c, x: c.alltoallv(x, [0] * c.size, np.empty_like(x), [True] * c.size)),
    ("sdispls[1]", lambda c, x: c.alltoallv(x, [0] * c.size, np.empty_like(x), [0] * c.size, [0, -1] + [0] * (c.size - 2))),
    ("sendcounts", lambda c, x: c.alltoallv(x, [0], np.empty_like(x), [0] * c.size)),
    ("tag", lambda c, x: c.send(x, (c.rank + 1) % c.size, tag=-1)),
    ("tag", lambda c, x: c.send(x, (c.rank + 1) % c.size, tag=2**32)),
    ("tag", lambda c, x: c.recv(x, (c.rank + 1) % c.size, tag=1.0)),
    ("tag", lambda c, x: c.recv(x, (c.rank + 1) % c.size, tag=True)),
    ("tag", lambda c, x: c.recv(x, (c.rank + 1) % c.size, tag="5")),
    ("peer", lambda c, x: c.send(x, True)),
    ("peer", lambda c, x: c.send(x, 1.0)),
    ("peer", lambda c, x: c.recv(x, c.size)),
    ("peer", lambda c, x: c.recv(x, c.rank)),
    ("timeout", lambda c, x: c.allreduce(x, timeout=True)),
    ("timeout", lambda c, x: c.allreduce(x, timeout=-1)),
    ("color", lambda c, x: c.split(True)),
    ("key", lambda c, x: c.split(0, key=1.5)),
]


def _bad_args(rank, size):
    comm = harp.init()
    out = []
    for name, call in BAD_CALLS:
        x = np.arange(4, dtype=np.float32) + rank
        try:
            call(comm, x)
            out.append((name, "no error", ""))
        except harp.InvalidArgumentError as e:
            out.append((name, "InvalidArgumentError", str(e)))
        except Exception as e:  # noqa: BLE001 - reported
            out.append((name, type(e).__name__, str(e)))
    # still usable, and numpy integers are fine where an int is meant
    x = np.full(3, rank + 1, np.int64)
    comm.allreduce(x, op=np.int64(3))  # max
    y = np.full(3, rank, np.int32)
    comm.broadcast(y, root=np.int32(size - 1))
    comm.destroy()
    return out, x.tolist(), y.tolist()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_meaningless_arguments_are_refused(transport):
    for out, mx, bc in run_ranks(3, _bad_args, env=_env(transport), timeout=180):
        for name, kind, msg in out:
            assert kind == "InvalidArgumentError" and name in msg, (name, kind, msg)
        assert mx == [3, 3, 3] and bc == [2, 2, 2]


# ---------------------------------------------------------------------------------------------------
# Hypothesis: generated argument combinations for every collective

ARRAY_DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bool"]
OVERRIDES = [None, None, None, "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
             "float32", "float64", "bool", "float", "double", "complex64", "no_such_type", True, 3]
OPS = ["sum", "SUM", "prod", "min", "max", "avg", "band", "bor", "bxor", "product", "mean", "bogus", "",
       0, 1, 2, 3, 7, 8, -1, True, False, 3.0, 0.5, None, b"sum", "np:2", "enum:max"]
ROOTS = [0, 1, 2, -1, 3, True, False, 1.0, None, "0", "np:1"]
TAGS = [0, 7, 261, 2**31, 2**32 - 1, 2**32, -1, True, 2.0, None]
COLLS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "alltoallv", "gather",
         "scatter", "p2p"]
FLOATS = {"float16", "bfloat16", "float32", "float64"}
BITWISE = {"band", "bor", "bxor"}


def _materialize(v):
    if isinstance(v, str) and v.startswith("np:"):
        return np.int64(int(v[3:]))
    if isinstance(v, str) and v.startswith("enum:"):
        return harp.ReduceOp[v[5:].upper()]
    return v


case_st = st.fixed_dictionaries({
    "coll": st.sampled_from(COLLS),
    "adt": st.sampled_from(ARRAY_DTYPES),
    "block": st.sampled_from([0, 1, 2, 3, 5, 8, 13]),   # elements per rank block
    "skew": st.sampled_from([0, 0, 0, 1, -1]),           # the secondary buffer this many elements off
    "override": st.sampled_from(OVERRIDES),
    "op": st.sampled_from(OPS),
    "root": st.sampled_from(ROOTS),
    "tag": st.sampled_from(TAGS),
    "inplace": st.booleans(),
    "async": st.booleans(),
    "counts": st.sampled_from(["packed", "float", "bool", "negative", "short", "past_end"]),
})

_NAMES = {"sum": "sum", "prod": "prod", "product": "prod", "min": "min", "max": "max", "avg": "avg",
          "mean": "avg", "band": "band", "bor": "bor", "bxor": "bxor"}
_CODES = ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]


def _int_ok(v, lo, hi):
    v = _materialize(v)
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and lo <= v <= hi


def _op_name(op):
    """The op the model says this argument means, or None (must be refused)."""
    op = _materialize(op)
    if isinstance(op, harp.ReduceOp):
        return _CODES[int(op)]
    if isinstance(op, str):
        return _NAMES.get(op.lower())
    if isinstance(op, (int, np.integer)) and not isinstance(op, bool) and 0 <= op < 8:
        return _CODES[int(op)]
    return None


def _interp(case):
    """The datatype name the buffers are read as, or None (an unknown dtype= must be refused)."""
    o = case["override"]
    if o is None:
        return case["adt"]
    if not isinstance(o, str):
        return None
    o = {"float": "float32", "double": "float64"}.get(o, o)
    return o if o in DataType.__members__ else None


def _np_interp(name):
    return numpy_dtype(DataType[name])


def _values(name, n, rank, i):
    """n small exact values of datatype `name` (exact in every float type), distinct per rank."""
    k = (np.arange(n) + rank + i) % 3 + 1
    if name == "bool":
        return ((np.arange(n) + rank) % 2).astype(np.bool_)
    return k.astype(_np_interp(name))


def _reduce_expected(name, op, blocks):
    """Elementwise reduction of the ranks' blocks (numpy arrays of datatype `name`), or None where
    the model does not predict values (avg of integers: rounding is the core's business)."""
    a = np.stack([b.astype(np.float64) for b in blocks])
    if name == "bool":
        b = a != 0
        r = {"sum": b.any(0), "max": b.any(0), "bor": b.any(0), "prod": b.all(0), "min": b.all(0),
             "band": b.all(0), "bxor": b.sum(0) % 2 == 1}.get(op)
        return None if r is None else r.astype(np.bool_)
    if op == "avg" and name not in FLOATS:
        return None
    ai = a.astype(np.int64)
    r = {"sum": lambda: a.sum(0), "prod": lambda: a.prod(0), "min": lambda: a.min(0), "max": lambda: a.max(0),
         "avg": lambda: a.mean(0), "band": lambda: np.bitwise_and.reduce(ai, 0),
         "bor": lambda: np.bitwise_or.reduce(ai, 0), "bxor": lambda: np.bitwise_xor.reduce(ai, 0)}[op]()
    return np.asarray(r).astype(_np_interp(name))


def _same(got_bytes, exp, name):
    got = np.frombuffer(got_bytes, _np_interp(name)) if len(got_bytes) else np.empty(0, _np_interp(name))
    if got.shape != exp.shape:
        return False
    if name in FLOATS:
        return bool(np.allclose(got.astype(np.float64), exp.astype(np.float64), rtol=1e-2))
    return bool(np.array_equal(got, exp))


def _run_case(comm, case, i):
    """Run one generated call on every rank; returns (keywords an error must name, or None when the
    model says the call is valid; outcome; detail; canaries intact)."""
    rank, size = comm.rank, comm.size
    coll, adt, block, skew = case["coll"], case["adt"], case["block"], case["skew"]
    name = _interp(case)
    isz = np.dtype(adt).itemsize
    override = case["override"] is not None
    bad = set()  # any bad argument may be named first
    if name is None:
        bad.add("dtype")
    esz = ITEMSIZE[DataType[name]] if name else 1
    op = _op_name(case["op"])
    reducing = coll in ("allreduce", "reduce", "reduce_scatter")
    if reducing and op is None:
        bad.add("op")
    if reducing and name and (name in FLOATS and op in BITWISE or name == "bool" and op == "avg"):
        bad.add("not defined")  # an op the datatype has none of
    rooted = coll in ("broadcast", "reduce", "gather", "scatter")
    if rooted and not _int_ok(case["root"], 0, size - 1):
        bad.add("root")
    if coll == "p2p" and not _int_ok(case["tag"], 0, 2**32 - 1):
        bad.add("tag")
    root = int(_materialize(case["root"])) if rooted and "root" not in bad else 0
    guards, checks = [], []  # checks: (guard, expected array of datatype `name`) after success

    def main(m):
        """The buffer every rank passes: about m elements of the datatype, whole array elements (so
        with dtype= its size may leave a remainder, which must be refused). Returns (guard, count)."""
        k = -(-m * esz // isz)
        g = Guarded(adt, k)
        guards.append(g)
        if g.nbytes % esz:
            bad.add("not a whole number")
            return g, 0
        n = g.nbytes // esz
        if name:
            g.fill_bytes(_values(name, n, rank, i).tobytes())
        return g, n

    def other(n, data=None):
        """A secondary buffer of exactly n elements of the datatype (bytes when dtype= is given)."""
        g = Guarded(adt, n) if not override else Guarded(np.uint8, n * esz)
        if data is not None:
            g.fill_bytes(data.tobytes())
        guards.append(g)
        return g

    def vals(n, q):
        return _values(name, n, q, i)

    op_arg, root_arg = _materialize(case["op"]), _materialize(case["root"])
    kw = {"dtype": _materialize(case["override"])} if override else {}
    kw["async_op"] = case["async"]
    outcome, detail = "ok", ""
    try:
        if coll in ("allreduce", "broadcast", "reduce"):
            s, n = main(block * 3 + (1 if skew else 0))
            inplace = case["inplace"] or coll == "broadcast"
            r = None
            if not inplace and (coll == "allreduce" or rank == root):
                extra = skew if coll == "allreduce" else 0  # reduce: only the root looks at recvbuf
                r = other(n + extra)
                if extra:
                    bad.add("recvbuf")
            if coll == "allreduce":
                comm.allreduce(s.arr, None if r is None else r.arr, op=op_arg, **kw)
            elif coll == "broadcast":
                comm.broadcast(s.arr, root=root_arg, **kw)
            else:
                comm.reduce(s.arr, None if r is None else r.arr, op=op_arg, root=root_arg, **kw)
            if name and coll == "broadcast":
                checks.append((s, vals(n, root)))
            elif name and (coll == "allreduce" or rank == root):
                exp = _reduce_expected(name, op, [vals(n, q) for q in range(size)]) if op else None
                if exp is not None:
                    checks.append((s if r is None else r, exp))
        elif coll in ("allgather", "gather"):
            s, n = main(block + (1 if skew else 0))
            r = None
            if coll == "allgather" or rank == root:
                extra = skew if coll == "allgather" else 0  # gather: the root-only buffer stays right
                r = other(n * size + extra)
                if extra:
                    bad.add("recvbuf")
            if coll == "allgather":
                comm.allgather(s.arr, r.arr, **kw)
            else:
                comm.gather(s.arr, None if r is None else r.arr, root=root_arg, **kw)
            if name and r is not None:
                checks.append((r, np.concatenate([vals(n, q) for q in range(size)])))
        elif coll in ("reduce_scatter", "alltoall"):
            s, n = main(max(block * size + skew, 0))
            if n % size:
                bad.update({"multiple", "elements"})
            b = n // size
            if coll == "reduce_scatter":
                r = other(b)
                comm.reduce_scatter(s.arr, r.arr, op=op_arg, **kw)
                full = _reduce_expected(name, op, [vals(n, q) for q in range(size)]) if name and op else None
                if full is not None:
                    checks.append((r, full[rank * b:(rank + 1) * b]))
            else:
                r = other(n)
                comm.alltoall(s.arr, r.arr, **kw)
                if name:
                    checks.append((r, np.concatenate([vals(n, q)[rank * b:(rank + 1) * b] for q in range(size)])))
        elif coll == "alltoallv":
            s, n = main(block * size)
            r = other(block * size)
            sc, rc = [block] * size, [block] * size
            mode = case["counts"]
            if mode == "float":
                sc = [c + 0.5 for c in sc]
                bad.add("sendcounts")
            elif mode == "bool":
                rc = [True] * size
                bad.add("recvcounts")
            elif mode == "negative":
                sc = [-1] + sc[1:]
                bad.add("sendcounts")
            elif mode == "short":
                rc = rc[:-1]
                bad.add("recvcounts")
            elif mode == "past_end":
                rc = [block + 1] * size
                bad.update({"recvcounts", "recvbuf"})
            comm.alltoallv(s.arr, sc, r.arr, rc, **kw)
            if name:
                checks.append((r, np.concatenate([vals(n, q)[rank * block:(rank + 1) * block]
                                                  for q in range(size)])))
        elif coll == "scatter":
            r, n = main(block + (1 if skew else 0))
            s = other(n * size, vals(n * size, rank)) if rank == root and name else None
            comm.scatter(None if s is None else s.arr, r.arr, root=root_arg, **kw)
            if name:
                checks.append((r, vals(n * size, root)[rank * n:(rank + 1) * n]))
        else:  # p2p: rank 0 sends to rank 1, others idle; peer, tag and dtype alike on both sides
            s, n = main(block * 2 + (1 if skew else 0))
            if rank == 0:
                comm.send(s.arr, 1, tag=_materialize(case["tag"]), **kw)
            elif rank == 1:
                comm.recv(s.arr, 0, tag=_materialize(case["tag"]), **kw)
                if name:
                    checks.append((s, vals(n, 0)))
            else:
                outcome = "idle"
    except (harp.InvalidArgumentError, ValueError) as e:
        outcome, detail = f"error:{type(e).__name__}", str(e)
    # the handle of an async call was dropped: a blocking call runs after it
    comm.barrier()
    if outcome == "ok":
        detail = "; ".join(f"buffer {k} wrong" for k, (g, e) in enumerate(checks) if not _same(g.bytes(), e, name))
    return (sorted(bad) or None, outcome, detail, all(g.intact() for g in guards))


def _cases(rank, size, cases):
    comm = harp.init()
    out = [_run_case(comm, c, i) for i, c in enumerate(cases)]
    comm.barrier()
    comm.destroy()
    return out


def _check_outcomes(cases, res):
    for i, case in enumerate(cases):
        per_rank = [r[i] for r in res]
        for rank, (bad, outcome, detail, intact) in enumerate(per_rank):
            where = f"case {i} {case} rank {rank}: {outcome} {detail}"
            assert intact, "canary overwritten: " + where
            if outcome == "idle":
                continue
            if bad is None:
                assert outcome == "ok" and not detail, "valid call failed or gave wrong data: " + where
            else:
                assert outcome.startswith("error:"), "invalid call accepted: " + where + f" (bad: {bad})"
                assert any(k in detail for k in bad), "error does not name the bad argument: " + where + f" {bad}"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("nranks", [2, 3])
@settings(max_examples=6, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(cases=st.lists(case_st, min_size=20, max_size=40))
def test_generated_arguments_error_or_correct(transport, nranks, cases):
    res = run_ranks(nranks, _cases, cases, env=_env(transport), timeout=300)
    _check_outcomes(cases, res)


# ---------------------------------------------------------------------------------------------------
# harp.nccl: arrays are checked against count x itemsize; scalars must be integers; arrays passed
# inside a group live until groupEnd

def _nccl(rank, size):
    import os

    from harp import nccl

    c = nccl.NcclCommunicator(size, bytes.fromhex(os.environ["HARP_UNIQUE_ID"]), rank)
    F = nccl.NCCL_FLOAT32
    g = Guarded(np.float32, 8)
    x = np.ones(8, np.float32)
    errs = []
    for call in (lambda: c.allReduce(x, g.arr, 9, F, nccl.NCCL_SUM),            # buffers too small
                 lambda: c.allReduce(np.ones(4, np.float64), g.arr, 8, nccl.NCCL_FLOAT64, nccl.NCCL_SUM),
                 lambda: c.allGather(x, np.empty(8 * size - 1, np.float32), 8, F),
                 lambda: c.reduceScatter(np.empty(8 * size - 1, np.float32), g.arr, 8, F, nccl.NCCL_SUM),
                 lambda: c.bcast(x[::2], 4, F, 0),                                 # strided
                 lambda: c.allReduce(x, g.arr, True, F, nccl.NCCL_SUM),
                 lambda: c.allReduce(x, g.arr, 8.0, F, nccl.NCCL_SUM),
                 lambda: c.allReduce(x, g.arr, -1, F, nccl.NCCL_SUM),
                 lambda: c.allReduce(x, g.arr, 8, F, True),
                 lambda: c.bcast(x, 8, F, True),
                 lambda: c.send(x, 8, F, 1.0),
                 lambda: c.recv(x, 8, True, 0)):
        try:
            call()
            errs.append(("no error", ""))
        except nccl.NcclError as e:
            errs.append((type(e).__name__, str(e), isinstance(e, harp.InvalidArgumentError)))
    # group: temporaries given to calls inside a group run at groupEnd
    outs = []
    nccl.groupStart()
    for i in range(6):
        out = np.empty(70_001 + i, np.float32)
        c.allReduce(np.full(70_001 + i, rank + i, np.float32), out, 70_001 + i, F, nccl.NCCL_SUM)
        outs.append((i, out))
    gc.collect()
    junk = [np.full(70_001 + i, -7.0, np.float32) for i in range(6)]
    nccl.groupEnd()
    tri = size * (size - 1) // 2
    group_ok = all(np.all(o == size * i + tri) for i, o in outs) and all(np.all(j == -7.0) for j in junk)
    c.allReduce(x, g.arr, 8, F, nccl.NCCL_SUM)  # still usable; numpy integer count is fine
    c.allReduce(g.arr, g.arr, np.int64(8), F, nccl.NCCL_SUM)
    ok = g.intact() and np.all(g.arr == size * size)
    c.destroy()
    return errs, group_ok, bool(ok)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nccl_wrappers_check_sizes_and_arguments(transport):
    for errs, group_ok, ok in run_ranks(2, _nccl, env=_env(transport), timeout=180):
        names = ["sendbuf", "sendbuf", "recvbuf", "sendbuf", "C-contiguous", "count", "count", "count", "op",
                 "root", "peer", "datatype"]
        for (kind, *rest), word in zip(errs, names):
            assert kind == "NcclInvalidArgument" and word in rest[0] and rest[1], (kind, rest, word)
        assert group_ok and ok


# ---------------------------------------------------------------------------------------------------
# torch backend: sizes come from the tensors; mismatched dtypes and split sizes are refused; async
# works own their tensors until done

def _torch(rank, size, url):
    import datetime

    import torch
    import torch.distributed as dist

    import harp.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=30))
    errs = []
    bad_calls = [
        lambda: dist.reduce_scatter(torch.zeros(4, dtype=torch.float32),
                                    [torch.zeros(4, dtype=torch.float64) for _ in range(size)]),
        lambda: dist.all_to_all_single(torch.zeros(2 * size), torch.zeros(2 * size),
                                       [2 * size + 1] + [-1] * (size - 1), [2] * size),
        lambda: dist.all_to_all_single(torch.zeros(2 * size), torch.zeros(2 * size), [2] * size,
                                       [1.5, 2.5] + [2] * (size - 2)),
        lambda: dist.send(torch.zeros(2), (rank + 1) % size, tag=-1),
        lambda: dist.send(torch.zeros(2), (rank + 1) % size, tag=2**32),
        lambda: dist.recv(torch.zeros(2), rank),
    ]
    if size == 1:
        bad_calls = [lambda: dist.scatter(torch.zeros(4, dtype=torch.float64), [torch.zeros(4, dtype=torch.float32)],
                                          src=0)]
    for call in bad_calls:
        try:
            call()
            errs.append("no error")
        except (ValueError, RuntimeError) as e:
            errs.append(f"{type(e).__name__}: {e}")
    # dropped async works on temporaries
    kept, bad = [], []
    for i in range(12):
        n = 70_001 + i
        dist.all_reduce(torch.full((n,), float(rank + i)), async_op=True)
        out = torch.empty(n * size)
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank * 100 + i)), async_op=True)
        kept.append((i, n, out))
        if i % 3 == 2:
            gc.collect()
    gc.collect()
    junk = [torch.full((70_001 + k,), -7.0) for k in range(12)]
    dist.barrier()
    for i, n, out in kept:
        exp = torch.cat([torch.full((n,), float(r * 100 + i)) for r in range(size)])
        if not torch.equal(out, exp):
            bad.append(f"all_gather {i}")
    if not all(bool((j == -7.0).all()) for j in junk):
        bad.append("a tensor allocated after the calls was overwritten")
    dist.destroy_process_group()
    return errs, bad


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("nranks", [1, 3])
def test_torch_backend_refuses_mismatches_and_owns_async_tensors(transport, nranks, tmp_path):
    pytest.importorskip("torch")
    for errs, bad in run_ranks(nranks, _torch, f"file://{tmp_path}/store", env=_env(transport), timeout=300):
        assert not bad, bad
        want = ["dtype"] if nranks == 1 else ["dtype", "split sizes", "split sizes", "tag", "tag",
                                                       "not another rank"]
        assert len(errs) == len(want)
        for e, w in zip(errs, want):
            assert w in e.lower(), (e, w)
