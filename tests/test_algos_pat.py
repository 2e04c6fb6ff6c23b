"""PAT allgather and reduce-scatter (NCCL's Parallel Aggregated Trees, core/algorithms/pat.h): the cases
tests/test_algos_logstep.py (every dtype and op, p 1-9, tcp and shm, in place and out, slices) does not reach.

- Packing: a message carries A blocks, A the largest power of two <= P/2 (P = 2^ceil(log2 p)) with
  A x block <= HARP_SEGMENT_BYTES. Sizes are picked (with `plan` below, the C++ rule) so that each p runs
  with A = P/2 (ceil(log2 p) messages), A = 1 (p-1 messages) and 1 < A < P/2 (several phase-I groups and
  phase-II dimensions), on tcp and shm, in place and out of place.
- More ranks: 13 (tcp) and 16 (tcp, shm), every packing.
- Scratch: reduce-scatter's partial sums take K+1 blocks at one block per message (K = ceil(log2 p)). With
  the scratch kept between calls (HARP_SCRATCH_KEEP_BYTES=1G), one call's growth of resident memory must stay
  within that, where Bruck in the same harness (1.5 p blocks) grows by more: the control that the measurement
  sees the scratch.
- The cost model knows both (harp-config --explain predicts them).
"""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import harp
from collectives_check import data, reference, same
from harness import run_ranks

MIB = 1 << 20


def plan(p, block_bytes, segment):
    """(A, messages) as core/algorithms/pat.h chooses them for one block (or slice) of block_bytes."""
    k = (p - 1).bit_length()
    big_p = 1 << k
    a = 1
    while a * 2 <= big_p // 2 and 2 * a * block_bytes <= segment:
        a *= 2
    g = big_p // a
    count = lambda x: (p - 1 - x) // g + 1 if x < p else 0  # noqa: E731
    msgs = sum(1 for x in range(1, g) if count(x))
    msgs += sum(1 for j in range(k - (g.bit_length() - 1)) if (1 << j) < count(0))
    return a, msgs


def packing_cases(p, segment=4096):
    """float32 counts giving A = P/2, 1 < A < P/2 (where P/2 > 2), and A = 1."""
    big_p = 1 << (p - 1).bit_length()
    cases = {}
    for n in (1, 3, 7, 31, 63, 127, 255, 511, 600, 1023, 1031):
        a, _ = plan(p, 4 * n, segment)
        kind = "P/2" if a == big_p // 2 else "1" if a == 1 else "mid"
        cases.setdefault(kind, n)
    return cases


def _check(rank, size, counts, ops=("sum", "max")):
    c = harp.init()
    p, bad, calls = c.size, [], 0
    dt = np.dtype(np.float32)
    for n in counts:
        allin = np.stack([data(q, n, dt) for q in range(p)])
        got = c.allgather(data(c.rank, n, dt), algo="pat")
        calls += 1
        if not np.array_equal(got, allin):
            bad.append(f"rank {c.rank}: allgather n={n}: {got.ravel()[:8]}")
        buf = np.zeros(p * n, dtype=dt)
        buf[c.rank * n:(c.rank + 1) * n] = data(c.rank, n, dt)
        c.allgather(buf[c.rank * n:(c.rank + 1) * n], buf, algo="pat")
        calls += 1
        if not np.array_equal(buf, allin.ravel()):
            bad.append(f"rank {c.rank}: allgather n={n} in place: {buf[:8]}")
        for op in ops:
            inputs = [data(q, p * n, dt, salt=5) for q in range(p)]
            exp = np.asarray(reference(inputs, dt, op, p))[c.rank * n:(c.rank + 1) * n]
            src = inputs[c.rank].copy()
            got = c.reduce_scatter(src, None, op, algo="pat")
            calls += 1
            if not same(got, exp, dt, p):
                bad.append(f"rank {c.rank}: reduce_scatter {op} n={n}: {got[:6]} expected {exp[:6]}")
            if not np.array_equal(src, inputs[c.rank]):
                bad.append(f"rank {c.rank}: reduce_scatter {op} n={n}: input modified")
            ip = inputs[c.rank].copy()
            c.reduce_scatter(ip, ip[c.rank * n:(c.rank + 1) * n], op, algo="pat")
            calls += 1
            if not same(ip[c.rank * n:(c.rank + 1) * n], exp, dt, p):
                bad.append(f"rank {c.rank}: reduce_scatter {op} n={n} in place: {ip[c.rank * n:][:6]}")
            rest = np.delete(ip, np.s_[c.rank * n:(c.rank + 1) * n])
            if not np.array_equal(rest, np.delete(inputs[c.rank], np.s_[c.rank * n:(c.rank + 1) * n])):
                bad.append(f"rank {c.rank}: reduce_scatter {op} n={n} in place: input outside block modified")
    c.barrier()
    return bad, calls


def _assert_clean(results, calls):
    bad = [b for r in results for b in r[0]]
    assert not bad, "\n".join(bad[:30]) + (f"\n... {len(bad)} failures" if len(bad) > 30 else "")
    assert [r[1] for r in results] == [calls] * len(results)


def test_packing_cases_cover_every_kind():
    # The cases below are what they say: the rule above gives all three packings at these p.
    for p in (5, 6, 9, 13, 16):
        assert set(packing_cases(p)) == {"P/2", "mid", "1"}, (p, packing_cases(p))
    assert plan(8, 4, 4096) == (4, 3) and plan(8, 4096, 4096) == (1, 7) and plan(9, 4, 4096) == (8, 4)
    assert plan(9, 1000, 4096) == (4, 5)  # G = 4: groups 1, 2, 3 and dimensions 0, 1


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("p", [5, 6, 9])
def test_every_packing(p, transport):
    counts = sorted(packing_cases(p).values())
    res = run_ranks(p, _check, counts, env={"HARP_TRANSPORT": transport, "HARP_SEGMENT_BYTES": "4096"},
                    timeout=180)
    _assert_clean(res, len(counts) * 6)


@pytest.mark.parametrize("p,transport", [(13, "tcp"), (16, "tcp"), (16, "shm")])
def test_more_ranks(p, transport):
    counts = sorted(packing_cases(p).values()) + [0]
    res = run_ranks(p, _check, counts, ("sum",), env={"HARP_TRANSPORT": transport, "HARP_SEGMENT_BYTES": "4096"},
                    timeout=300)
    _assert_clean(res, len(counts) * 4)


def _rss_trimmed():
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _scratch_growth(rank, size, algo, n):
    c = harp.init()
    src = np.ones(size * n, np.float32)
    dst = np.full(n, -1.0, np.float32)  # touched now: np.zeros' pages would first be touched by the call
    c.reduce_scatter(np.ones(size * 4, np.float32), np.zeros(4, np.float32), "sum", algo=algo)  # connect, warm
    c.barrier()
    before = _rss_trimmed()
    c.reduce_scatter(src, dst, "sum", algo=algo)
    grown = _rss_trimmed() - before
    ok = bool(np.all(dst == size))
    c.barrier()
    return grown, ok


def test_reduce_scatter_scratch_is_log_sized():
    # 16 ranks, float32 blocks of 4 MiB; a 7 MiB segment sends each alone (A = 1), in one slice. PAT holds
    # sums at depths 0-3 of its tree, plus the receive buffer: K + 1 = 5 blocks, 20 MiB. One buffer per group
    # with children instead (8 of them) would be 9 blocks; Bruck's rotation is 24 (its 112 MiB budget holds them).
    p, n = 16, MIB
    blk = 4 * n
    k = (p - 1).bit_length()
    env = {"HARP_TRANSPORT": "tcp", "HARP_SEGMENT_BYTES": str(7 * MIB), "HARP_SCRATCH_KEEP_BYTES": "1G"}
    assert plan(p, blk, 7 * MIB)[0] == 1
    pat = run_ranks(p, _scratch_growth, "pat", n, env=env, timeout=300)
    assert all(ok for _, ok in pat), pat
    bound = (k + 1) * blk
    worst = max(g for g, _ in pat)
    assert worst <= bound + 2 * MIB, (
        f"pat grew resident memory by {worst / MIB:.1f} MiB in one {blk // MIB} MiB-block reduce_scatter at {p} "
        f"ranks: more than its K+1 = {k + 1} blocks ({bound // MIB} MiB)")
    assert worst >= 2 * blk - MIB, f"{worst / MIB:.1f} MiB: the measurement does not see pat's scratch at all"
    bruck = run_ranks(p, _scratch_growth, "bruck", n, env=env, timeout=300)
    assert all(ok for _, ok in bruck), bruck
    least = min(g for g, _ in bruck)
    assert least >= bound + 4 * blk, (
        f"control: bruck (p + p/2 = {p + p // 2} blocks of scratch) grew only {least / MIB:.1f} MiB")


@pytest.mark.parametrize("coll", ["allgather", "reduce_scatter"])
def test_explain_predicts_pat(coll):
    out = subprocess.run([sys.executable, "-m", "harp.tools.config", "--explain", coll, "8", "--ranks", "16",
                          "--transport", "tcp"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^  (\w+)\s+.*?\s([\d.]+ [mu]s)\s", out.stdout, re.M)}
    assert "pat" in rows, out.stdout
