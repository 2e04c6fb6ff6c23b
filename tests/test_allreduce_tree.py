"""Allreduce `tree` (pipelined double binary tree), forced by name, on real ranks.

Beyond the matrices every registered allreduce joins (collectives_check.ALLREDUCE_ALGOS: every
dtype and op, sizes 0/1/7/1031, in and out of place, tcp, shm, lanes): many segments per half
(HARP_SEGMENT_BYTES=4096 against 100003 float32, so the reduce waves of later segments overlap the
broadcast waves and two ranks linked in both trees carry both in one FIFO), rank counts 2-9 (the
mirrored trees of even p, the shifted trees of odd p), random floats whose result must be bitwise
the same on every rank (each half is summed once, by its tree's root), integers compared exactly,
and the flight record saying that the tree ran.
"""
from __future__ import annotations

import numpy as np
import pytest

import harp
import harp.debug
from collectives_check import registered_algorithms
from harness import run_ranks

N = 100003


def _tree(rank, size, n):
    c = harp.init()
    rng = np.random.default_rng(1000 + c.rank)
    x = rng.standard_normal(n).astype(np.float32)
    alls = [np.random.default_rng(1000 + q).standard_normal(n).astype(np.float32) for q in range(c.size)]
    out = c.allreduce(x.copy(), np.empty_like(x), algo="tree")
    inp = x.copy()
    c.allreduce(inp, algo="tree")  # in place
    ints = np.arange(n, dtype=np.int64) * (c.rank + 1)
    c.allreduce(ints, op="max", algo="tree")
    mx = c.allreduce(np.full(n, c.rank, np.float64), None, "max", algo="tree")
    ran = {e["harp_algorithm"] for e in harp.debug.flight_record()["entries"]
           if e["profiling_name"] == "nccl:all_reduce"}
    # every rank's result, to compare bytes across ranks
    gathered = np.asarray(c.allgather(out.view(np.uint32))).reshape(c.size, n)
    c.destroy()
    ref = np.sum(np.stack(alls).astype(np.float64), axis=0)
    return {
        "close": bool(np.allclose(out, ref, rtol=1e-4, atol=1e-4 * c.size)),
        "inplace_equal": bool(np.array_equal(inp, out)),
        "ranks_bitwise_equal": bool(all(np.array_equal(gathered[q], out.view(np.uint32)) for q in range(c.size))),
        "int_max_exact": bool(np.array_equal(ints, np.arange(n, dtype=np.int64) * c.size)),
        "float_max": bool(np.all(mx == c.size - 1)),
        "ran": ran,
    }


def test_tree_is_registered():
    assert "tree" in registered_algorithms("allreduce")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 8, 9])
def test_tree_many_segments(p, transport):
    env = {"HARP_TRANSPORT": transport, "HARP_SEGMENT_BYTES": "4096"}
    res = run_ranks(p, _tree, N, env=env, timeout=180)
    for r, got in enumerate(res):
        assert got["ran"] == {"tree"}, (r, got)
        bad = [k for k, v in got.items() if v is False]
        assert not bad, f"rank {r} of {p} ({transport}): {bad}"

