"""Allreduce cost through torch.distributed over harp, over gloo, and through raw HARP, in one run.

    PYTHONPATH=python python bench/torch_overhead.py --ranks 2 --out bench/RESULTS-torch.md

Every rank holds three communicators over the same loopback TCP: the default
process group (backend "harp"), a gloo group (new_group(backend="gloo")), and a
raw harp.Communicator (rendezvous through the same c10d store) called with
numpy arrays, which is what HARP users call directly. For each message size
the three are called in turn, call by call in rotating order (so all three
see the same background load on a shared machine), `iters x --rounds` blocking
float32 SUM allreduces each after a warmup and a barrier; each call is timed,
and the figure is the median call time (min in parentheses), averaged over
ranks.
Results are checked once per size (every rank's input is rank+1).
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20]


def worker(rank, world, port, args, q):
    import numpy as np
    import torch
    import torch.distributed as dist

    import harp
    import harp.torch  # noqa: F401
    from harp.torch._store import TorchStore

    torch.set_num_threads(1)
    dist.init_process_group("harp", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    store = dist.PrefixStore("rawharp/", dist.distributed_c10d._get_default_store())
    raw = harp.Communicator.from_store(TorchStore(store), rank, world, timeout=120)

    def avg(x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, group=gloo)
        return t.item() / world

    rows = []
    for nbytes in args.sizes:
        n = nbytes // 4
        t = torch.full((n,), float(rank + 1))
        a = np.full(n, rank + 1, dtype=np.float32)
        exp = float(sum(range(1, world + 1)))
        # correctness once per size and path
        dist.all_reduce(t)
        ok = bool(torch.all(t == exp))
        t.fill_(rank + 1)
        dist.all_reduce(t, group=gloo)
        ok &= bool(torch.all(t == exp))
        raw.allreduce(a)
        ok &= bool(np.all(a == exp))
        iters = max(5, min(args.max_iters, int(args.budget_bytes / nbytes)))
        calls = {
            "raw harp": lambda: raw.allreduce(a),
            "torch+harp": lambda: dist.all_reduce(t),
            "torch+gloo": lambda: dist.all_reduce(t, group=gloo),
        }
        # Calls are interleaved one by one, in rotating order, and timed one by one: the three paths see
        # the same background load, and the median per path ignores the preempted outliers.
        samples = {k: [] for k in calls}
        names = list(calls)
        for _ in range(3):
            for fn in calls.values():
                fn()
        dist.barrier(group=gloo)
        for i in range(iters * args.rounds):
            for name in names[i % 3:] + names[:i % 3]:
                fn = calls[name]
                t0 = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t0) * 1e6)
        rows.append((nbytes, iters * args.rounds, ok, {k: avg(statistics.median(v)) for k, v in samples.items()},
                     {k: avg(min(v)) for k, v in samples.items()}))
    raw.destroy()
    dist.destroy_process_group()
    if rank == 0:
        q.put(rows)


def fmt_size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=SIZES)
    ap.add_argument("--budget-bytes", type=float, default=64e6, help="bytes per timed loop (sets iters)")
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--out", help="append a markdown table here")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.ranks, port, args, q)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    rows = q.get(timeout=1800)
    for p in procs:
        p.join(60)
    lines = [
        f"ranks {args.ranks}, float32 SUM allreduce, loopback TCP, {os.cpu_count()} CPUs, "
        f"median (min) microseconds per call over `calls` calls per path, interleaved call by call",
        "",
        "| size | calls | raw harp | torch+harp | torch overhead | torch+gloo | harp vs gloo | check |",
        "|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for nbytes, iters, ok, med, mn in rows:
        r, h, g = med["raw harp"], med["torch+harp"], med["torch+gloo"]
        lines.append(f"| {fmt_size(nbytes)} | {iters} | {r:.1f} ({mn['raw harp']:.1f}) | {h:.1f} "
                     f"({mn['torch+harp']:.1f}) | {100 * (h - r) / r:+.1f}% | {g:.1f} ({mn['torch+gloo']:.1f}) | "
                     f"{g / h:.2f}x | {'ok' if ok else 'WRONG'} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")


if __name__ == "__main__":
    sys.exit(main())
