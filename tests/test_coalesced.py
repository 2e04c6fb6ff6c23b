"""Coalesced allreduce (tensor fusion; python/harp/coalesce.py): lists of mixed sizes and
dtypes reduced in place like one allreduce each, few collectives (counted in the flight recorder),
chunking through a small fusion buffer, async completion, and lists that differ between ranks
(MismatchError on every rank, communicator still usable). Ranks are forked processes over real
sockets and shared memory (tests/harness.py), 3 and 4 ranks.
"""
from __future__ import annotations

import numpy as np
import pytest

from harness import run_ranks

import harp

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BF16 = None

# (dtype, element count): odd sizes, an empty array, one crossing chunk borders under a 4K buffer,
# one large enough to travel alone under it; dtypes interleaved so groups are not contiguous.
SPECS = [(np.float32, 1), (np.int32, 7), (np.float64, 1000), (np.float32, 4097), (np.int64, 0),
         (np.float32, 3), (np.int32, 1031), (np.uint8, 33), (np.float64, 5), (np.float32, 65537),
         (np.float16, 257), (np.int64, 129)]
if BF16 is not None:
    SPECS.append((BF16, 515))


def _value(rank, i, dt, n):
    """Small integers (exact in every dtype, sums of 4 ranks fit uint8 and float16 exactly)."""
    v = (np.arange(n) * (i + 3) + rank * 5 + i) % 11
    return v.astype(dt)


def _expected(size, i, dt, n, op):
    vals = [_value(r, i, dt, n).astype(np.float64) for r in range(size)]
    out = np.sum(vals, axis=0) if op == "sum" else np.max(vals, axis=0)
    return out.astype(dt)


def _entries():
    return len(harp.debug.flight_record()["entries"])


def _lists(rank, size, op, async_op):
    import harp.debug  # noqa: F401 - flight record entries count the collectives
    comm = harp.init()
    xs = [_value(rank, i, dt, n) for i, (dt, n) in enumerate(SPECS)]
    ids = [x.__array_interface__["data"][0] for x in xs]
    before = _entries()
    if async_op:
        w = comm.allreduce_coalesced(xs, op=op, async_op=True)
        out = w.wait()
    else:
        out = comm.allreduce_coalesced(xs, op=op)
    calls = _entries() - before
    assert out is not None and len(out) == len(xs) and all(o is x for o, x in zip(out, xs))
    assert [x.__array_interface__["data"][0] for x in xs] == ids  # in place: same buffers
    bad = [i for i, (dt, n) in enumerate(SPECS) if not np.array_equal(xs[i], _expected(size, i, dt, n, op))]
    comm.destroy()
    return bad, calls


def _groups(mode="sg"):
    """Collectives expected with the defaults. sg: the signature check and one list schedule per
    dtype. fuse (64M buffer, arrays of 128K or more alone): the signature check, one per alone
    array, one per dtype of the others."""
    if mode == "sg":
        return 1 + len({np.dtype(dt) for dt, n in SPECS if n})
    alone = [n * np.dtype(dt).itemsize >= 128 << 10 for dt, n in SPECS]
    assert 0 < sum(alone) < len(SPECS)  # both kinds present
    return 1 + sum(alone) + len({np.dtype(dt) for (dt, n), a in zip(SPECS, alone) if n and not a})


@pytest.mark.parametrize("mode", ["sg", "fuse"])
@pytest.mark.parametrize("nranks,transport,op,async_op", [(3, "tcp", "sum", False), (4, "tcp", "max", True),
                                                          (3, "shm", "max", False), (4, "shm", "sum", True)])
def test_mixed_sizes_and_dtypes_in_place_one_collective_per_dtype(nranks, transport, op, async_op, mode):
    res = run_ranks(nranks, _lists, op, async_op, env={"HARP_TRANSPORT": transport, "HARP_COALESCE": mode},
                    timeout=300)
    for bad, calls in res:
        assert bad == [], f"wrong results for list entries {bad}"
        assert calls == _groups(mode), f"{calls} collectives, expected {_groups(mode)} ({mode})"


@pytest.mark.parametrize("fusion,nranks", [("4K", 3), ("0", 4)])
def test_small_fusion_buffer_chunks_and_direct_arrays(fusion, nranks):
    """HARP_COALESCE=fuse: a 4K buffer cuts groups into 2K chunks (arrays span chunk borders, large
    ones go alone); 0 sends every array alone. Same results either way; more collectives than the default."""
    res = run_ranks(nranks, _lists, "sum", fusion == "0",
                    env={"HARP_TRANSPORT": "tcp", "HARP_FUSION_BYTES": fusion, "HARP_COALESCE": "fuse"}, timeout=300)
    nonempty = sum(1 for _, n in SPECS if n)
    for bad, calls in res:
        assert bad == [], f"wrong results for list entries {bad}"
        if fusion == "0":
            assert calls == 1 + nonempty
        else:
            assert calls > _groups("fuse")


def _repeated(rank, size):
    """Many calls back to back through a small buffer, mixed with plain allreduces: blocking, async
    + wait(), async + test() until True, and async never waited (the next coalesced call finishes it)."""
    comm = harp.init()
    bad, unwaited = [], None
    for step in range(13):
        n = [int(v) for v in np.random.default_rng(step).integers(1, 3000, size=9)]
        xs = [np.full(k, rank + step + j, np.float32) for j, k in enumerate(n)]
        want = [sum(r + step + j for r in range(size)) for j in range(len(n))]
        y = np.full(5, rank, np.int64)
        mode = step % 4
        w = comm.allreduce_coalesced(xs, async_op=mode != 0)
        comm.allreduce(y)
        if unwaited is not None:  # the call above finished the previous step's
            bad += [("unwaited", step, j) for j, (x, v) in enumerate(zip(*unwaited)) if not np.all(x == v)]
            unwaited = None
        if mode == 1:
            assert w.wait() is not None
        elif mode == 2:
            while not w.test():
                pass
        elif mode == 3:
            unwaited = (xs, want)
            continue
        bad += [(step, j) for j in range(len(n)) if not np.all(xs[j] == want[j])]
        bad += [("y", step)] if not np.all(y == sum(range(size))) else []
    comm.destroy()
    return bad


@pytest.mark.parametrize("mode", ["sg", "fuse"])
def test_repeated_blocking_and_async_calls_reuse_the_buffer(mode):
    res = run_ranks(3, _repeated, env={"HARP_TRANSPORT": "tcp", "HARP_FUSION_BYTES": "16K", "HARP_COALESCE": mode},
                    timeout=300)
    assert res == [[], [], []]


def _mismatch(rank, size, how):
    comm = harp.init(timeout=60)
    xs = [np.ones(10, np.float32), np.ones(20, np.float32), np.ones(30, np.int32)]
    op = "sum"
    if rank == size - 1:
        if how == "order":  # same total bytes and dtypes: only the signature can tell
            xs[0], xs[1] = xs[1], xs[0]
        elif how == "length":
            xs.append(np.ones(1, np.float32))
        elif how == "dtype":
            xs[2] = np.ones(30, np.float32)
        elif how == "op":
            op = "max"
    before = [x.copy() for x in xs]
    err = None
    try:
        comm.allreduce_coalesced(xs, op=op)
    except harp.HarpError as e:
        err = (type(e).__name__, str(e))
    untouched = all(np.array_equal(a, b) for a, b in zip(xs, before))
    z = np.full(3, rank + 1.0, np.float32)
    comm.allreduce(z)  # still usable: every rank knew
    ok = comm.allreduce_coalesced([np.ones(4, np.float32)])[0].tolist()
    comm.destroy()
    return err, untouched, z.tolist(), ok


@pytest.mark.parametrize("how", ["order", "length", "dtype", "op"])
def test_mismatched_list_on_one_rank_raises_mismatch_error_on_every_rank(how):
    res = run_ranks(3, _mismatch, how, env={"HARP_TRANSPORT": "tcp"}, timeout=180)
    for err, untouched, z, ok in res:
        assert err is not None and err[0] == "MismatchError", err
        assert "different tensor lists" in err[1]
        assert untouched
        assert z == [6.0, 6.0, 6.0] and ok == [3.0] * 4


def _bad_args(rank, size):
    comm = harp.init()
    out = []
    for what, args in [("non-contiguous", ([np.ones((4, 4), np.float32)[:, 1]],)),
                       ("read-only", ([np.frombuffer(b"\0" * 16, np.float32)],)),
                       ("not a list", (5,)),
                       ("one array", (np.ones(3, np.float32),)),
                       ("bad op", ([np.ones(3, np.float32)], "frob"))]:
        try:
            comm.allreduce_coalesced(*args)
            out.append((what, None))
        except harp.InvalidArgumentError as e:
            out.append((what, str(e)))
    try:  # bitwise op on floats: the same on every rank, refused by the core's check on every rank
        comm.allreduce_coalesced([np.ones(3, np.int32), np.ones(3, np.float32)], op="bor")
        out.append(("bitwise float", None))
    except harp.InvalidArgumentError as e:
        out.append(("bitwise float", str(e)))
    xs = [np.ones(3, np.float32), np.ones(2, np.int32)]
    comm.allreduce_coalesced(xs)
    comm.destroy()
    return out, [x.tolist() for x in xs]


def test_bad_arguments_name_the_problem_and_leave_the_communicator_usable():
    res = run_ranks(3, _bad_args, env={"HARP_TRANSPORT": "tcp"}, timeout=180)
    for out, xs in res:
        errs = dict(out)
        assert all(v is not None for v in errs.values()), errs
        assert "tensors[0]" in errs["non-contiguous"] and "contiguous" in errs["non-contiguous"]
        assert "read-only" in errs["read-only"]
        assert "list" in errs["not a list"] and "single array" in errs["one array"]
        assert "frob" in errs["bad op"]
        assert xs == [[3.0] * 3, [3] * 2]


def test_empty_list_and_single_rank():
    def one(rank, size):
        comm = harp.init()
        a = np.arange(5, dtype=np.float64)
        r = (comm.allreduce_coalesced([]), comm.allreduce_coalesced([a])[0].tolist())
        comm.destroy()
        return r
    assert run_ranks(1, one, timeout=60) == [([], [0.0, 1.0, 2.0, 3.0, 4.0])]


def _torch_coalesced(rank, size, url):
    import datetime
    import warnings

    import torch
    import torch.distributed as dist

    import harp.debug
    import harp.torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("harp", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    dts = [torch.float32, torch.int64, torch.float64, torch.float32, torch.bfloat16, torch.int32]
    sizes = [3, 1031, 7, 4097, 65, 1]

    def make():
        return [torch.arange(n, dtype=torch.int64).remainder(7).add(rank).to(dt) for n, dt in zip(sizes, dts)]

    def want(dt, n):
        return sum(torch.arange(n, dtype=torch.int64).remainder(7).add(r) for r in range(size)).to(dt)

    out = {}
    ts = [t for t in make() if t.dtype == torch.float32]  # torch's deprecated API insists on one dtype
    ptrs = [t.data_ptr() for t in ts]
    before = len(harp.debug.flight_record()["entries"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated in torch, still served
        dist.all_reduce_coalesced(ts)
    out["deprecated"] = [bool(torch.equal(t, want(t.dtype, t.numel()))) for t in ts]
    # one list schedule over the tensors' own memory (HARP_COALESCE=sg), not a flattened copy
    out["recorded"] = [e["profiling_name"] for e in harp.debug.flight_record()["entries"][before:]]
    out["same_memory"] = [t.data_ptr() for t in ts] == ptrs
    ts = make()
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    out["manager"] = [bool(torch.equal(t, want(t.dtype, t.numel()))) for t in ts]
    dist.destroy_process_group()
    return out


def test_torch_allreduce_coalesced_mixed_dtypes(tmp_path):
    pytest.importorskip("torch")
    url = "file://" + str(tmp_path / "store")
    res = run_ranks(3, _torch_coalesced, url, env={"HARP_TRANSPORT": "tcp"}, timeout=300)
    for out in res:
        assert out == {"deprecated": [True] * 2, "manager": [True] * 6,
                       "recorded": ["nccl:allreduce_coalesced"], "same_memory": True}, out


# -- the core's list schedule (HARP_COALESCE=sg; core/algorithms/allreduce_coalesced_ring.cc) -------------

_OPS = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def _sg_pieces(rank, size, dtype, op, in_place, seed):
    """Raw list calls through the binding (no Python signature check): random pieces of odd sizes,
    some shorter than the rank count, in place or into separate receive buffers."""
    from harp._types import dtype_of, parse_op
    comm = harp.init()
    rng = np.random.default_rng(seed)
    counts = [int(c) for c in rng.integers(0, 3000, size=11)] + [1, 2, size - 1, size + 1, 0]
    dt = np.dtype(dtype)
    def value(r, i, n):
        g = np.random.default_rng(seed * 1000 + r * 100 + i)
        if dt.kind == "f":
            return (g.standard_normal(n) * (0.5 if op == "prod" else 10)).astype(dt)
        hi = 3 if op == "prod" else 50
        return g.integers(1, hi, size=n).astype(dt)
    sends = [value(rank, i, n) for i, n in enumerate(counts)]
    keep = [s.copy() for s in sends]
    recvs = sends if in_place else [np.full(n, 7, dt) for n in counts]
    addr = lambda a: a.__array_interface__["data"][0]  # noqa: E731
    w = comm._c.submit_coalesced([addr(a) for a in sends], [addr(a) for a in recvs], counts, int(dtype_of(sends[0])),
                                 int(parse_op(op)), "", -1.0, False)
    w.wait(-1.0)
    algo = comm._c.last_algorithm(13)
    ok_in = in_place or all(np.array_equal(a, b) for a, b in zip(sends, keep))  # out of place: inputs untouched
    ins = [[value(r, i, n) for i, n in enumerate(counts)] for r in range(size)]
    want = []
    for i in range(len(counts)):
        stack = np.stack([ins[r][i] for r in range(size)]) if counts[i] else np.zeros((size, 0), dt)
        if op == "avg":
            want.append((np.sum(stack.astype(np.float64), axis=0) / size))
        else:
            want.append(_OPS[op](stack.astype(np.float64 if dt.kind == "f" else dt), axis=0))
    # float16: every partial sum of the ring is rounded to float16 (an ulp is 2^-10 of the value)
    rtol, atol = (size * 2e-3, size * 0.02) if dt == np.float16 else (1e-5, 1e-5)
    bad = [i for i in range(len(counts))
           if not (np.allclose(recvs[i].astype(np.float64), want[i], rtol=rtol, atol=atol) if dt.kind == "f"
                   else np.array_equal(recvs[i], want[i].astype(dt)))]
    comm.destroy()
    return bad, ok_in, algo, [r.tobytes() for r in recvs]


@pytest.mark.parametrize("nranks,transport", [(2, "shm"), (3, "tcp"), (5, "tcp"), (4, "shm")])
@pytest.mark.parametrize("dtype,op", [(np.float32, "sum"), (np.float64, "avg"), (np.int32, "max"), (np.int64, "prod"),
                                      (np.uint8, "min"), (np.float16, "sum"), (np.int8, "sum")])
@pytest.mark.parametrize("in_place", [True, False])
def test_list_schedule_every_dtype_op_odd_sizes_bitwise_equal_on_every_rank(nranks, transport, dtype, op, in_place):
    res = run_ranks(nranks, _sg_pieces, dtype, op, in_place, nranks * 7 + len(op),
                    env={"HARP_TRANSPORT": transport}, timeout=300)
    for bad, ok_in, algo, _ in res:
        assert bad == [], f"wrong results for pieces {bad}"
        assert ok_in, "out of place: an input was written"
        assert algo == "ring"
    assert all(r[3] == res[0][3] for r in res), "ranks hold different bytes"


def _sg_layout_mismatch(rank, size, layouts):
    from harp._types import DataType
    comm = harp.init(timeout=20)
    counts = layouts[0] if rank != size - 1 else layouts[1]  # same total, different layout
    bufs = [np.ones(n, np.float32) for n in counts]
    addrs = [b.__array_interface__["data"][0] for b in bufs]
    try:
        comm._c.submit_coalesced(addrs, addrs, counts, int(DataType.float32), 0, "", -1.0, False).wait(-1.0)
        return None
    except harp.HarpError as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("nranks,layouts", [(3, ([10, 20], [20, 10])), (2, ([1, 1, 1, 1], [2, 2]))])
def test_list_schedule_layout_disagreement_is_a_mismatch_on_every_rank(nranks, layouts):
    """Same total count, another layout on one rank: the core's exact descriptor check (a hash of
    the counts) raises MismatchError on every rank before any data moves. Without it, [1,1,1,1]
    against [2,2] on 2 ranks posts 4 messages against 2 and waits for the timeout."""
    for err in run_ranks(nranks, _sg_layout_mismatch, layouts, env={"HARP_TRANSPORT": "tcp"}, timeout=120):
        assert err is not None and err[0] == "MismatchError", err


def _sg_bad(rank, size):
    from harp._types import DataType
    comm = harp.init()
    out = {}
    a = np.ones(64, np.float32)
    base = a.__array_interface__["data"][0]
    f32 = int(DataType.float32)
    cases = {
        "overlap": ([base, base + 16], [base, base + 16], [8, 8]),       # pieces 0 and 1 overlap
        "partial": ([base], [base + 4], [8]),                             # send and receive partly overlap
        "foreign": ([base, base + 128], [base + 128, base + 192], [8, 8]),  # piece 1 reads piece 0's output
        "null": ([0], [base], [4]),
        "lengths": ([base], [base, base], [4]),
    }
    for name, (s, r, c) in cases.items():
        try:
            comm._c.submit_coalesced(s, r, c, f32, 0, "", -1.0, False).wait(-1.0)
            out[name] = None
        except harp.InvalidArgumentError as e:
            out[name] = str(e)
    try:
        i32 = np.ones(4, np.int32)
        p = i32.__array_interface__["data"][0]
        comm._c.submit_coalesced([p], [p], [4], int(DataType.int32), 4, "", -1.0, False).wait(-1.0)
        out["int avg"] = None
    except harp.InvalidArgumentError as e:
        out["int avg"] = str(e)
    b = np.ones(4, np.float32)
    comm.allreduce(b)  # still usable
    comm.destroy()
    return out, b.tolist()


def test_list_schedule_bad_buffers_are_refused_naming_the_pieces():
    for out, b in run_ranks(2, _sg_bad, env={"HARP_TRANSPORT": "tcp"}, timeout=120):
        assert all(v is not None for v in out.values()), out
        assert "pieces 0 and 1 overlap" in out["overlap"]
        assert "piece 0" in out["partial"] and "overlap" in out["partial"]
        assert "send buffer of piece 1 overlaps the receive buffer of piece 0" in out["foreign"]
        assert "piece 0: send buffer is null" in out["null"]
        assert "differ in length" in out["lengths"]
        assert "avg of int32" in out["int avg"]
        assert b == [2.0] * 4


def _sg_int_avg(rank, size):
    comm = harp.init()
    xs = [np.full(5, rank * 3, np.int32), np.full(3, 1.5 * rank, np.float32)]
    comm.allreduce_coalesced(xs, op="avg")
    comm.destroy()
    return [x.tolist() for x in xs]


def test_integer_avg_runs_array_by_array_and_float_avg_in_the_list():
    for xs in run_ranks(3, _sg_int_avg, env={"HARP_TRANSPORT": "tcp"}, timeout=120):
        assert xs == [[3] * 5, [1.5] * 3]


def _sg_tiny(rank, size, counts):
    """Pieces shorter than the rank count: some ranks receive nothing in some or all steps."""
    comm = harp.init()
    xs = [np.full(n, rank + 1 + i, np.int64) for i, n in enumerate(counts)]
    comm.allreduce_coalesced(xs)
    comm.destroy()
    return [x.tolist() for x in xs]


@pytest.mark.parametrize("nranks,counts", [(3, [1]), (3, [1, 1, 2]), (5, [1, 3, 0, 2]), (4, [5, 1])])
def test_list_schedule_pieces_shorter_than_the_rank_count(nranks, counts):
    for xs in run_ranks(nranks, _sg_tiny, counts, env={"HARP_TRANSPORT": "tcp"}, timeout=120):
        assert xs == [[sum(r + 1 + i for r in range(nranks))] * n for i, n in enumerate(counts)]
