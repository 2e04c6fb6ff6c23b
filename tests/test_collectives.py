"""Every collective x dtype x op x algorithm x size, against numpy, over TCP,
for 1..8 ranks (3, 5, 6, 7 included), in separate processes over real sockets."""
import numpy as np
import pytest

import harp
from collectives_check import BF16, check_everything, registered_algorithms
from harness import run_ranks


def _all(rank, size, sizes):
    comm = harp.init()
    failures, calls = check_everything(comm, sizes)
    comm.destroy()
    return failures, calls


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_collective_dtype_op_algorithm(nranks):
    res = run_ranks(nranks, _all, (0, 1, 7, 1031), env={"HARP_TRANSPORT": "tcp"}, timeout=600)
    failures = [f for fs, _ in res for f in fs]
    calls = sum(c for _, c in res)
    assert calls > 500 * nranks  # the matrix really ran
    assert not failures, "\n".join(failures[:30])


def _large(rank, size, n, algo, nsocks):
    comm = harp.init()
    x = ((np.arange(n, dtype=np.int64) * 13 + rank) % 1000).astype(np.float32)
    out = np.empty_like(x)
    comm.allreduce(x, out, algo=algo)
    exp = sum(((np.arange(n, dtype=np.int64) * 13 + r) % 1000) for r in range(size)).astype(np.float32)
    ok = np.array_equal(out, exp)
    comm.allreduce(x, algo=algo)  # in place
    ok2 = np.array_equal(x, exp)
    comm.destroy()
    return ok, ok2


@pytest.mark.slow
@pytest.mark.parametrize("nranks,algo", [(2, "ring"), (3, "ring"), (4, "halving_doubling"), (5, "halving_doubling"),
                                         (3, "recursive_doubling"), (4, "ring")])
def test_allreduce_over_16MB(nranks, algo):
    n = 4 * 1024 * 1024 + 13  # > 16 MB of float32, not divisible by the rank count
    res = run_ranks(nranks, _large, n, algo, 1, env={"HARP_TRANSPORT": "tcp"}, timeout=600)
    assert all(a and b for a, b in res), res


@pytest.mark.slow
def test_multiple_sockets_per_peer():
    n = 5 * 1024 * 1024 + 7
    env = {"HARP_TRANSPORT": "tcp", "HARP_NSOCKS_PERPEER": "4", "HARP_SOCKET_STRIPE_MIN": "64K",
           "HARP_SOCKET_CHUNK": "100K"}
    res = run_ranks(3, _large, n, "ring", 4, env=env, timeout=600)
    assert all(a and b for a, b in res), res


def _async(rank, size):
    comm = harp.init()
    bufs = [np.full(1000 + i, float(rank + i), dtype=np.float64) for i in range(6)]
    works = [comm.allreduce(b, async_op=True) for b in bufs]
    big = np.full(3_000_000, 1.0, dtype=np.float32)
    wbig = comm.allreduce(big, async_op=True)
    # a blocking call after async ones runs after them, in order
    small = np.array([rank], dtype=np.int64)
    comm.allreduce(small)
    done_before = all(w.test() for w in works)
    outs = [w.wait() for w in works]
    wbig.wait(timeout=120)
    comm.destroy()
    ok = all(np.all(o == sum(r + i for r in range(size))) for i, o in enumerate(outs))
    return ok, bool(np.all(big == size)), int(small[0]), done_before


def test_async_handles_complete_in_order():
    res = run_ranks(3, _async, env={"HARP_TRANSPORT": "tcp"})
    for ok, okbig, small, done_before in res:
        assert ok and okbig and small == 0 + 1 + 2
        assert done_before  # issue order: earlier async work finished before the blocking call returned


def _split(rank, size):
    comm = harp.init()
    sub = comm.split(rank % 2, key=-rank)  # reversed order inside each color
    x = np.array([rank], dtype=np.int32)
    sub.allreduce(x)
    members = [r for r in range(size) if r % 2 == rank % 2]
    res = (sub.rank, sub.size, int(x[0]))
    exp = (sorted(members, reverse=True).index(rank), len(members), sum(members))
    none = comm.split(harp.UNDEFINED if rank == 0 else 1)
    r0 = none is None if rank == 0 else none.size == size - 1
    sub.destroy()
    comm.destroy()
    return res == exp, r0


def test_split():
    res = run_ranks(5, _split, env={"HARP_TRANSPORT": "tcp"})
    assert all(a and b for a, b in res), res


def _algo_choice(rank, size):
    comm = harp.init()
    return (comm.algorithm("allreduce", 2), comm.algorithm("allreduce", 64 * 1024 * 1024),
            comm.algorithm("allreduce", 100_000))


def test_tuning_table_and_override():
    res = run_ranks(4, _algo_choice, env={"HARP_TRANSPORT": "tcp"})
    assert res[0] == ("recursive_doubling", "ring", "halving_doubling")
    res = run_ranks(2, _algo_choice, env={"HARP_TRANSPORT": "tcp", "HARP_ALGO": "allreduce:0-1K:ring,allreduce:halving_doubling"})
    assert res[0] == ("ring", "halving_doubling", "halving_doubling")


def _buffers(rank, size):
    import array

    comm = harp.init()
    a = array.array("d", [rank + 1.0] * 5)          # buffer protocol, in place
    comm.allreduce(a)
    b = bytearray([rank + 1] * 3)                  # bytes as uint8
    comm.allreduce(b, op="max")
    out = {"array": list(a), "bytearray": list(b)}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:                          # a DLPack producer on the CPU
        t = torch.full((4,), float(rank + 1))
        comm.allreduce(t)
        out["dlpack"] = t.tolist()
        bf = np.full(8, rank + 1, dtype=np.uint16)  # bfloat16 bits in a uint16 array
        bf[:] = np.array([rank + 1], dtype=np.float32).view(np.uint32) >> 16
        comm.allreduce(bf, dtype="bfloat16")
        out["bf16"] = float(np.array([int(bf[0]) << 16], dtype=np.uint32).view(np.float32)[0])
    comm.destroy()
    return out


def test_buffer_protocol_dlpack_and_dtype_override():
    res = run_ranks(3, _buffers, env={"HARP_TRANSPORT": "tcp"})
    for out in res:
        assert out["array"] == [6.0] * 5
        assert out["bytearray"] == [3] * 3
        if "dlpack" in out:
            assert out["dlpack"] == [6.0] * 4
            assert out["bf16"] == 6.0


# ---------------------------------------------------------------------------- the C fast path
def _fast_path(rank, size):
    """allgather / reduce_scatter / alltoall / reduce on plain arrays take _harp.run_arrays
    (checked in C); anything it declines goes the general way and gets the same results
    or a worded error."""
    from harp._harp import run_arrays
    from harp._types import Coll

    comm = harp.init()
    c = comm._c
    got = {}
    x = (np.arange(5, dtype=np.float64) + 10 * rank)
    # taken: right sizes and dtypes
    out = np.empty(5 * size)
    got["ag_taken"] = run_arrays(c, int(Coll.allgather), x, out, 0, 0, None)
    got["ag_ok"] = np.array_equal(out, np.concatenate([np.arange(5) + 10 * r for r in range(size)]))
    # declined: wrong recv size, wrong dtype, in place (recv None) for allgather
    got["ag_declined"] = [run_arrays(c, int(Coll.allgather), x, np.empty(5 * size + 1), 0, 0, None),
                          run_arrays(c, int(Coll.allgather), x, np.empty(5 * size, np.float32), 0, 0, None),
                          run_arrays(c, int(Coll.allgather), x, None, 0, 0, None)]
    # the API: recv allocated, shape (size, 5); a strided input goes the general way
    got["ag_api"] = comm.allgather(x).shape == (size, 5)
    strided = np.arange(10, dtype=np.float64)[::2] + 10 * rank
    got["ag_strided"] = np.array_equal(comm.allgather(strided).ravel(),
                                       np.concatenate([np.arange(0, 10, 2) + 10 * r for r in range(size)]))
    # sendbuf aliasing another rank's block of recvbuf (not NCCL's in-place rule) still works
    buf = np.zeros(5 * size)
    q = (rank + 1) % size
    buf[5 * q:5 * q + 5] = x
    comm.allgather(buf[5 * q:5 * q + 5], buf, algo="ring")
    got["ag_alias"] = np.array_equal(buf, out)
    buf[:] = 0
    buf[5 * q:5 * q + 5] = x
    comm.allgather(buf[5 * q:5 * q + 5], buf, algo="direct")
    got["ag_alias"] &= np.array_equal(buf, out)
    try:
        comm.allgather(x, np.empty(5 * size + 1))
        got["ag_err"] = "no error"
    except harp.HarpError as e:
        got["ag_err"] = str(e)

    rs_in = np.arange(3 * size, dtype=np.int32) * (rank + 1)
    rs_out = np.empty(3, np.int32)
    got["rs_taken"] = run_arrays(c, int(Coll.reduce_scatter), rs_in, rs_out, 0, 0, None)
    tot = sum(range(1, size + 1))
    got["rs_ok"] = np.array_equal(rs_out, np.arange(3 * size, dtype=np.int32)[3 * rank:3 * rank + 3] * tot)
    got["rs_max"] = np.array_equal(comm.reduce_scatter(rs_in, op="max"),
                                   np.arange(3 * size, dtype=np.int32)[3 * rank:3 * rank + 3] * size)
    got["rs_declined"] = run_arrays(c, int(Coll.reduce_scatter), rs_in, np.empty(4, np.int32), 0, 0, None)

    a2a = np.full(2 * size, rank, np.int64)
    got["a2a_ok"] = np.array_equal(comm.alltoall(a2a), np.repeat(np.arange(size), 2))
    got["a2a_declined"] = run_arrays(c, int(Coll.alltoall), np.ones(2 * size + 1), np.ones(2 * size + 1), 0, 0,
                                     None) if size > 1 else False

    root = size - 1
    r_in = np.full(4, float(rank + 1))
    res = comm.reduce(r_in, np.empty(4) if rank == root else None, op="prod", root=root)
    got["reduce_ok"] = (res is None) if rank != root else bool(np.all(res == float(np.prod(range(1, size + 1)))))
    comm.destroy()
    return got


@pytest.mark.parametrize("transport,nranks", [("tcp", 3), ("shm", 3), ("shm", 1)])
def test_fast_path_for_gather_scatter_alltoall_reduce(transport, nranks):
    res = run_ranks(nranks, _fast_path, env={"HARP_TRANSPORT": transport}, timeout=120)
    for g in res:
        assert g["ag_taken"] is True and g["ag_ok"], g
        assert g["ag_declined"] == [False, False, False], g
        assert g["ag_api"] and g["ag_strided"] and g["ag_alias"], g
        assert "recvbuf has" in g["ag_err"], g
        assert g["rs_taken"] is True and g["rs_ok"] and g["rs_max"], g
        assert g["rs_declined"] is False, g
        assert g["a2a_ok"] and g["a2a_declined"] is False, g
        assert g["reduce_ok"], g


# ---------------------------------------------------------------------------- bitwise identical on every rank
# Random floats make the order of additions visible in the last bits: an
# algorithm in which ranks reduce in different orders (or a transport that
# delivers a stale block) gives ranks results that differ by an ulp. Every
# registered allreduce algorithm (from the library's registry, not a list kept
# here), every float dtype, sum / prod / avg, odd counts.
BITWISE_DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)] + ([BF16] if BF16 else [])
BITWISE_OPS = ["sum", "prod", "avg"]
BITWISE_COUNTS = (1, 7, 1031, 20_003)
# Machine epsilon per dtype (bfloat16 has 8 significand bits, float16 11).
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def _random_input(rank, n, dt, op, seed=15):
    """Seeded per (rank, n, dtype, op): normal values for sum/avg, magnitudes in
    [0.5, 1.5) with random signs for prod (no overflow or underflow in float16 on 5 ranks)."""
    rng = np.random.default_rng([seed, rank, n, BITWISE_DTYPES.index(dt), BITWISE_OPS.index(op)])
    if op == "prod":
        v = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
    else:
        v = rng.standard_normal(n)
    return v.astype(dt)


def _within_tolerance(got, inputs, dt, op, size):
    """got (dtype dt) against the float64 reduction of the dtype-rounded inputs: at most
    (size + 1) roundings, each of relative size eps, of the sum of magnitudes (sum, avg)
    or of the product of magnitudes (prod)."""
    st = np.stack([x.astype(np.float64) for x in inputs])
    if op == "prod":
        ref, scale = st.prod(0), np.abs(st).prod(0)
    else:
        ref, scale = st.sum(0), np.abs(st).sum(0)
        if op == "avg":
            ref, scale = ref / size, scale / size
    err = np.abs(got.astype(np.float64) - ref)
    bound = (size + 1) * EPS[dt.name] * scale
    bad = np.flatnonzero(err > bound)
    return None if bad.size == 0 else (int(bad[0]), float(got.astype(np.float64)[bad[0]]), float(ref[bad[0]]))


def _bitwise(rank, size):
    import hashlib

    comm = harp.init()
    algos = registered_algorithms("allreduce")
    hashes, far = {}, []
    for algo in algos:
        for dt in BITWISE_DTYPES:
            for op in BITWISE_OPS:
                for n in BITWISE_COUNTS:
                    inputs = [_random_input(r, n, dt, op) for r in range(size)]
                    x = inputs[rank].copy()
                    out = np.empty_like(x)
                    comm.allreduce(x, out, op, algo=algo)
                    comm.allreduce(x, None, op, algo=algo)  # in place
                    for mode, got in (("out-of-place", out), ("in-place", x)):
                        key = f"{algo} {dt.name} {op} n={n} {mode}"
                        hashes[key] = hashlib.sha256(got.tobytes()).hexdigest()
                        off = _within_tolerance(got, inputs, dt, op, size)
                        if off:
                            far.append(f"rank {rank}: {key}: index {off[0]} got {off[1]!r}, float64 says {off[2]!r}")
    comm.destroy()
    return algos, hashes, far


def hash_mismatches(per_rank):
    """per_rank: one {case: hash} per rank. Returns the cases whose hash differs between
    ranks (or that some rank lacks), each with the ranks grouped by the hash they hold."""
    out = []
    for key in sorted(set().union(*per_rank)):
        groups = {}
        for r, h in enumerate(per_rank):
            groups.setdefault(h.get(key, "missing"), []).append(r)
        if len(groups) > 1:
            out.append(f"{key}: ranks {sorted(groups.values())} hold different results")
    return out


def test_hash_mismatches_reports_one_differing_byte():
    import hashlib

    a = np.random.default_rng(1).standard_normal(1031).astype(np.float32)
    b = a.copy()
    b.view(np.uint8)[517] ^= 1  # one bit of one byte
    ha, hb = hashlib.sha256(a.tobytes()).hexdigest(), hashlib.sha256(b.tobytes()).hexdigest()
    assert hash_mismatches([{"k": ha}, {"k": ha}, {"k": ha}]) == []
    assert hash_mismatches([{"k": ha}, {"k": hb}, {"k": ha}]) == ["k: ranks [[0, 2], [1]] hold different results"]
    assert hash_mismatches([{"k": ha}, {}]) == ["k: ranks [[0], [1]] hold different results"]


def test_within_tolerance_catches_a_wrong_last_bits_result():
    inputs = [_random_input(r, 1031, np.dtype(np.float32), "sum") for r in range(3)]
    exact = sum(x.astype(np.float64) for x in inputs).astype(np.float32)
    assert _within_tolerance(exact, inputs, np.dtype(np.float32), "sum", 3) is None
    wrong = exact.copy()
    wrong[10] += np.float32(1e-3)
    assert _within_tolerance(wrong, inputs, np.dtype(np.float32), "sum", 3)[0] == 10


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("nranks", [3, 5])
def test_allreduce_bitwise_identical_on_every_rank(transport, nranks):
    res = run_ranks(nranks, _bitwise, env={"HARP_TRANSPORT": transport}, timeout=600)
    algos = res[0][0]
    assert len(algos) >= 3 and all(a == algos for a, _, _ in res), [a for a, _, _ in res]
    per_rank = [h for _, h, _ in res]
    cases = len(algos) * len(BITWISE_DTYPES) * len(BITWISE_OPS) * len(BITWISE_COUNTS) * 2
    assert all(len(h) == cases for h in per_rank), [len(h) for h in per_rank]
    mismatches = hash_mismatches(per_rank)
    assert not mismatches, f"{len(mismatches)} of {cases} cases differ between ranks:\n" + "\n".join(mismatches[:30])
    far = [f for _, _, fs in res for f in fs]
    assert not far, f"{len(far)} results outside the tolerance:\n" + "\n".join(far[:30])
