"""Every collective x dtype x op x algorithm x size, against numpy, over TCP,
for 1..8 ranks (3, 5, 6, 7 included), in separate processes over real sockets."""
import numpy as np
import pytest

import harp
from collectives_check import ALLREDUCE_ALGOS, check_everything
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
