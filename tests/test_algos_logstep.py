"""Log-step allgather and reduce-scatter algorithms, forced by name, on real ranks.

allgather `bruck` (any p), `pat` (any p), `recursive_doubling` (2^k ranks, fallback bruck) and
reduce_scatter `recursive_halving` (any p: non-powers of two fold the extra ranks),
`bruck` and `pat` (any p), checked against numpy for p in 1..9, tcp and shm, out
of place, in place (NCCL's rule), sendbuf inside recvbuf elsewhere, count 0 and
odd counts; every dtype and op at every p, plus one large odd count (float32),
also cut into slices (the Bruck algorithms' bounded scratch, HARP_SEGMENT_BYTES=4096; for `pat` that
segment also sends every block alone, p-1 messages, where the default packs them into ceil(log2 p)).
tests/test_algos_pat.py has PAT's own cases (mixed packing, 13 and 16 ranks, its scratch bound). The reduce-scatter input
must come back unmodified (but for the output block, in place).
"""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import harp
from collectives_check import DTYPES, data, ops_for, reference, same, registered_algorithms
from harness import run_ranks

AG_ALGOS = ["bruck", "pat", "recursive_doubling"]
RS_ALGOS = ["bruck", "pat", "recursive_halving"]
RANKS = [2, 3, 4, 5, 6, 7, 8, 9]
SIZES = (0, 1, 7, 1031)
LARGE = 100003  # odd, ~400 KB of float32 per block: several segments, blocking waits


def _check_allgather(rank, size, algos, large=False):
    c = harp.init()
    bad, calls = [], 0
    p = c.size
    for dt, sizes in [(np.dtype(np.float32), (LARGE,))] if large else [(dt, SIZES) for dt in DTYPES]:
        for n in sizes:
            allin = np.stack([data(q, n, dt) for q in range(p)])
            for algo in algos:
                what = f"allgather {algo} {dt} n={n}"
                got = c.allgather(data(c.rank, n, dt), algo=algo)
                calls += 1
                if not np.array_equal(got, allin):
                    bad.append(f"rank {c.rank}: {what} out of place: {got.ravel()[:8]}")
                # in place, NCCL's rule: sendbuf is block `rank` of recvbuf
                buf = np.zeros(p * n, dtype=dt)
                buf[c.rank * n:(c.rank + 1) * n] = data(c.rank, n, dt)
                c.allgather(buf[c.rank * n:(c.rank + 1) * n], buf, algo=algo)
                calls += 1
                if not np.array_equal(buf, allin.ravel()):
                    bad.append(f"rank {c.rank}: {what} in place: {buf[:8]}")
                if n == 0 or p == 1:
                    continue
                # sendbuf inside recvbuf, another block, and straddling block r and a neighbour
                for off in ((c.rank + 1) % p * n, c.rank * n + (1 if c.rank < p - 1 else -1)):
                    buf = np.zeros(p * n, dtype=dt)
                    buf[off:off + n] = data(c.rank, n, dt)
                    c.allgather(buf[off:off + n], buf, algo=algo)
                    calls += 1
                    if not np.array_equal(buf, allin.ravel()):
                        bad.append(f"rank {c.rank}: {what} sendbuf at element {off} of recvbuf: {buf[:8]}")
    c.barrier()
    return bad, calls


def _check_reduce_scatter(rank, size, algos, large=False):
    c = harp.init()
    bad, calls = [], 0
    p = c.size
    for dt, sizes in [(np.dtype(np.float32), (LARGE,))] if large else [(dt, SIZES) for dt in DTYPES]:
        ops = ["sum", "max"] if large else ops_for(dt)
        for n in sizes:
            for op in ops:
                inputs = [data(q, p * n, dt, salt=3) for q in range(p)]
                exp = np.asarray(reference(inputs, dt, op, p))[c.rank * n:(c.rank + 1) * n]
                for algo in algos:
                    what = f"reduce_scatter {algo} {dt} {op} n={n}"
                    src = inputs[c.rank].copy()
                    got = c.reduce_scatter(src, None, op, algo=algo)
                    calls += 1
                    if got.shape != exp.shape or not same(got, exp, dt, p):
                        bad.append(f"rank {c.rank}: {what}: got {got[:6]} expected {exp[:6]}")
                    if not np.array_equal(src, inputs[c.rank]):
                        bad.append(f"rank {c.rank}: {what}: input modified")
                    ip = inputs[c.rank].copy()
                    c.reduce_scatter(ip, ip[c.rank * n:(c.rank + 1) * n], op, algo=algo)
                    calls += 1
                    blk = ip[c.rank * n:(c.rank + 1) * n]
                    if not same(blk, exp, dt, p):
                        bad.append(f"rank {c.rank}: {what} in place: got {blk[:6]} expected {exp[:6]}")
                    rest = np.delete(ip, np.s_[c.rank * n:(c.rank + 1) * n])
                    if not np.array_equal(rest, np.delete(inputs[c.rank], np.s_[c.rank * n:(c.rank + 1) * n])):
                        bad.append(f"rank {c.rank}: {what} in place: input outside block {c.rank} modified")
    c.barrier()
    return bad, calls


def test_the_new_algorithms_are_registered():
    assert set(AG_ALGOS) <= set(registered_algorithms("allgather"))
    assert set(RS_ALGOS) <= set(registered_algorithms("reduce_scatter"))


def _assert_clean(results):
    bad = [b for r in results for b in r[0]]
    assert not bad, "\n".join(bad[:30]) + (f"\n... {len(bad)} failures" if len(bad) > 30 else "")
    assert all(r[1] > 0 for r in results)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("p", RANKS)
def test_allgather_logstep(p, transport):
    res = run_ranks(p, _check_allgather, AG_ALGOS, env={"HARP_TRANSPORT": transport}, timeout=120)
    _assert_clean(res)


@pytest.mark.parametrize("transport,segment", [("tcp", None), ("shm", None), ("tcp", "4096"), ("shm", "4096")])
@pytest.mark.parametrize("p", [3, 4, 7, 8])
def test_large_odd_count(p, transport, segment):
    # HARP_SEGMENT_BYTES=4096: the Bruck scratch is bounded at 64 KiB, so these blocks (400 KB)
    # and, in the dtype matrix below, 1031 int64/float64 elements at 8 ranks go in slices.
    env = {"HARP_TRANSPORT": transport} | ({"HARP_SEGMENT_BYTES": segment} if segment else {})
    _assert_clean(run_ranks(p, _check_allgather, AG_ALGOS, True, env=env, timeout=120))
    _assert_clean(run_ranks(p, _check_reduce_scatter, RS_ALGOS, True, env=env, timeout=120))


@pytest.mark.parametrize("p", [5, 8])
def test_dtype_matrix_in_slices(p):
    env = {"HARP_TRANSPORT": "shm", "HARP_SEGMENT_BYTES": "4096"}
    _assert_clean(run_ranks(p, _check_allgather, ["bruck", "pat"], env=env, timeout=120))
    _assert_clean(run_ranks(p, _check_reduce_scatter, ["bruck", "pat"], env=env, timeout=120))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("p", RANKS)
def test_reduce_scatter_logstep(p, transport):
    res = run_ranks(p, _check_reduce_scatter, RS_ALGOS, env={"HARP_TRANSPORT": transport}, timeout=120)
    _assert_clean(res)


def test_single_rank():
    _assert_clean(run_ranks(1, _check_allgather, AG_ALGOS, timeout=60))
    _assert_clean(run_ranks(1, _check_reduce_scatter, RS_ALGOS, timeout=60))


def _fallback(rank, size):
    c = harp.init()
    picked = c.algorithm("allgather", 7)
    n = 7
    allin = np.stack([data(q, n, np.dtype(np.float32)) for q in range(c.size)])
    got = c.allgather(data(c.rank, n, np.dtype(np.float32)))  # HARP_ALGO names recursive_doubling
    got2 = c.allgather(data(c.rank, n, np.dtype(np.float32)), algo="recursive_doubling")
    return picked, bool(np.array_equal(got, allin)), bool(np.array_equal(got2, allin))


@pytest.mark.parametrize("p,expect", [(3, "bruck"), (4, "recursive_doubling")])
def test_pow2_restricted_allgather_falls_back_to_bruck(p, expect):
    res = run_ranks(p, _fallback, env={"HARP_TRANSPORT": "tcp", "HARP_ALGO": "allgather:recursive_doubling"},
                    timeout=60)
    assert res == [(expect, True, True)] * p, res


def test_explain_shows_the_fallback():
    out = subprocess.run([sys.executable, "-m", "harp.tools.config", "--explain", "allgather", "4K", "--ranks", "3",
                          "--transport", "tcp", "--algo", "recursive_doubling"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    m = re.search(r"^pick: (\w+) \((.*)\)$", out.stdout, re.M)
    assert m and m.group(1) == "bruck" and "fallback bruck" in m.group(2), out.stdout
    assert re.search(r"^  recursive_doubling .*power-of-two", out.stdout, re.M), out.stdout
