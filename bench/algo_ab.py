"""A/B two HARP algorithms of one collective in the same ranks, interleaved (ABBA batches), for
collectives harp-bench does not sweep (gather, scatter) and for alltoall.

    PYTHONPATH=python python bench/algo_ab.py gather -np 8 --transport tcp --algos linear,binomial \
        --sizes 8,64,512,4K,32K --iters 50 --rounds 9

sizes: bytes per block (the tuning table's `bytes`: count x element size, float32). Each round runs
`iters` calls of A then of B (B then A on odd rounds) after a barrier; a batch's time is its slowest
rank's mean call; the figure is the median over rounds, with the min-max of the rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import harp  # noqa: E402
from harness import run_ranks  # noqa: E402


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1024, "M": 1 << 20}.get(s[-1], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def _rank(rank, size, coll, algos, sizes, iters, rounds, root):
    comm = harp.init(timeout=120)
    out = {}
    for nbytes in sizes:
        n = max(nbytes // 4, 0)
        x = np.ones(n * (size if coll in ("scatter", "alltoall") else 1), np.float32)
        recv = np.empty(n * size if coll in ("gather", "alltoall") else n, np.float32)

        def call(algo):
            if coll == "gather":
                comm.gather(x, recv if rank == root else None, root, algo=algo)
            elif coll == "scatter":
                comm.scatter(x if rank == root else None, recv, root, algo=algo)
            else:
                comm.alltoall(x, recv, algo=algo)

        for algo in algos:  # warm-up
            for _ in range(max(iters // 5, 2)):
                call(algo)
        times = {a: [] for a in algos}
        for rd in range(rounds):
            order = algos if rd % 2 == 0 else algos[::-1]
            for algo in order:
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    call(algo)
                times[algo].append((time.perf_counter() - t0) / iters)
        out[nbytes] = times
    comm.barrier()
    comm.destroy()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("coll", choices=["gather", "scatter", "alltoall"])
    ap.add_argument("-np", type=int, default=4)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--algos", required=True, help="A,B")
    ap.add_argument("--sizes", default="8,64,512,4K,32K")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--root", type=int, default=0)
    a = ap.parse_args(argv)
    algos = a.algos.split(",")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    res = run_ranks(a.np, _rank, a.coll, algos, sizes, a.iters, a.rounds, a.root,
                    env={"HARP_TRANSPORT": a.transport}, timeout=3600)
    print(f"# {a.coll} -np {a.np} --transport {a.transport} iters {a.iters} rounds {a.rounds} root {a.root} "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"# {'bytes/block':>11} " + " ".join(f"{x + ' us (min-max)':>26}" for x in algos) + "   B/A")
    for nbytes in sizes:
        cols, med = [], []
        for algo in algos:
            per_round = [max(r[nbytes][algo][i] for r in res) * 1e6 for i in range(a.rounds)]
            m = statistics.median(per_round)
            med.append(m)
            cols.append(f"{m:9.1f} ({min(per_round):7.1f}-{max(per_round):7.1f})")
        print(f"  {nbytes:>11} " + " ".join(f"{c:>26}" for c in cols) + f"   {med[1] / med[0]:.2f}")


if __name__ == "__main__":
    main()
