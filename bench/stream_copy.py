"""STREAM-like copy bandwidth of this machine, for comparing collective busbw to
what memory can do (bench/RESULTS-shm.md).

    python bench/stream_copy.py -np 2 [--mb 256] [--reps 5]

Starts `np` processes at once (as many as the collective had ranks); each
copies an `--mb` MB float64 array into another (numpy copyto = memcpy) `--reps`
times. Reported like STREAM "Copy": bytes read + bytes written per second, best
repetition, per process and summed over the processes. Also the cache-resident
copy rate for a 1 MB block (what chunked shared-memory algorithms see).
"""
import argparse
import multiprocessing as mp
import time

import numpy as np


def _copy(n_bytes, reps, q, barrier):
    a = np.ones(n_bytes // 8)
    b = np.zeros_like(a)
    np.copyto(b, a)
    barrier.wait()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    # cache-resident block
    small_a, small_b = np.ones(1 << 17), np.zeros(1 << 17)  # 1 MB
    np.copyto(small_b, small_a)
    t = time.perf_counter()
    for _ in range(200):
        np.copyto(small_b, small_a)
    small = (time.perf_counter() - t) / 200
    q.put((2 * n_bytes / best / 1e9, 2 * small_a.nbytes / small / 1e9))


def measure(nproc, mb=256, reps=5):
    ctx = mp.get_context("fork")
    q, barrier = ctx.Queue(), ctx.Barrier(nproc)
    ps = [ctx.Process(target=_copy, args=(mb << 20, reps, q, barrier)) for _ in range(nproc)]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return [r[0] for r in res], [r[1] for r in res]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-np", type=int, default=1)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    big, small = measure(a.np, a.mb, a.reps)
    print(f"# STREAM-like copy, {a.np} process(es) at once, {a.mb} MB arrays: "
          f"per process {' '.join(f'{x:.2f}' for x in big)} GB/s, total {sum(big):.2f} GB/s (read+write); "
          f"1 MB in-cache block: total {sum(small):.2f} GB/s")
