"""Bounded memory: what a communicator keeps between collectives has a cap.

The scratch block the algorithms borrow (core/engine/scratch.h) keeps at most
HARP_SCRATCH_KEEP_BYTES between collectives. Ranks (forked processes, real
sockets and shared memory) run collectives over many distinct sizes up to
32 MiB — binomial reduces (whose non-root ranks work in 2x the message of
scratch), integer-avg allreduces (which travel widened, 8x the bytes) — and
the resident memory after malloc_trim must come back to within the cap (plus
slack) of where it was before the big calls. The same run with the cap raised
to 1 GiB must keep the high-water mark: the measurement can see the holder.
The long-running version of this is bench/soak.py.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from harness import run_ranks

import harp

MIB = 1 << 20
SLACK = 12 * MIB  # allocator and page-cache noise of a 2-rank numpy job


def _rss_trimmed() -> int:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _distinct_sizes(rank, size):
    comm = harp.init()
    for n in (1, 1000, 100_000):  # warm up every path at small sizes first
        for root in range(size):
            comm.reduce(np.ones(n, np.float32), np.zeros(n, np.float32), "sum", root, algo="binomial")
        comm.allreduce(np.ones(n, np.int8), np.zeros(n, np.int8), "avg")
    base = _rss_trimmed()
    peak = 0
    for k, mib in enumerate((3, 5, 8, 11, 16, 20, 27, 32)):
        n = mib * MIB // 4 + 17 * k  # distinct, odd sizes
        x = np.full(n, rank + 1, np.float32)
        for root in range(size):
            out = np.zeros(n, np.float32)
            comm.reduce(x, out, "sum", root, algo="binomial")
            if rank == root and out[0] != size * (size + 1) / 2:
                return f"reduce n={n}: got {out[0]}"
        m = mib * MIB // 8 + k
        y = np.full(m, 2 * rank, np.int8)
        comm.allreduce(y, None, "avg")
        if y[-1] != size - 1:
            return f"int8 avg n={m}: got {y[-1]}"
        del x, y, out
        peak = max(peak, _rss_trimmed())
    comm.barrier()
    end = _rss_trimmed()
    comm.destroy()
    return base, end, peak


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_scratch_does_not_keep_its_high_water_mark(transport):
    keep = 16 * MIB
    res = run_ranks(2, _distinct_sizes, env={"HARP_TRANSPORT": transport, "HARP_SCRATCH_KEEP_BYTES": str(keep)},
                    timeout=180)
    for rank, r in enumerate(res):
        assert not isinstance(r, str), f"rank {rank}: wrong result: {r}"
        base, end, _ = r
        grown = end - base
        assert grown <= keep + SLACK, (
            f"rank {rank} ({transport}): resident memory after malloc_trim grew {grown / MIB:.1f} MiB over the "
            f"big collectives (cap {keep // MIB} MiB + {SLACK // MIB} MiB slack): something keeps its largest size")


def test_raised_cap_keeps_the_high_water_mark():
    """The control: with the cap at 1 GiB the scratch of a 32 MiB binomial reduce (64 MiB) stays resident,
    so the bound above is a measurement of the cap, not of nothing."""
    res = run_ranks(2, _distinct_sizes, env={"HARP_TRANSPORT": "tcp", "HARP_SCRATCH_KEEP_BYTES": "1G"}, timeout=180)
    grown = [r[1] - r[0] for r in res]
    assert min(grown) >= 48 * MIB, f"growth {[g / MIB for g in grown]} MiB: the 64 MiB scratch was not seen"
