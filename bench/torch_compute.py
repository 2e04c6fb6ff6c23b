"""Does the communication library slow the training's own compute?

Trains FSDP2 (`fully_shard` over 5 x Linear(W)) or DDP on N ranks of this host,
started as users start them without torchrun: torch.multiprocessing.spawn, torch's
default intra-op thread count unless --threads says otherwise. Per step it records
the step time and the time of a fixed matmul (32 x W @ W x W) run between steps, the
compute that a library's waiting threads can disturb. Backends run in one job, in
turn (ABBA order per repetition), so the machine's load is shared alike.

    python bench/torch_compute.py --backends harp,gloo --model fsdp,ddp \
        --threads default,1 --ranks 2 --repeats 5 --json out.json

Each row: backend, model, threads, repetition; step and matmul medians (ms). The
summary gives, per (model, threads), HARP's step / gloo's step as min, median and
max over repetitions. --load N runs N busy processes beside the job (a shared
host's noisy neighbours).
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def _rank(rank, size, backend, model_kind, threads, width, steps, url, out_q):
    import torch
    import torch.distributed as dist

    if backend == "harp":
        import harp.torch  # noqa: F401
    if threads not in ("default", "omp1"):
        torch.set_num_threads(int(threads))
    dist.init_process_group(backend, init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width) for _ in range(5)]
    net = torch.nn.Sequential(*layers)
    if model_kind == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in layers:
            fully_shard(layer)
        fully_shard(net)
        model = net
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net, bucket_cap_mb=0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(32, width, generator=g)
    y = torch.randn(32, width, generator=g)
    a = torch.randn(32, width, generator=g)
    b = torch.randn(width, width, generator=g)
    step_ms, mm_ms, losses = [], [], []
    for i in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        t2 = time.perf_counter()
        losses.append(loss.item())
        if i >= 3:  # warm-up steps excluded
            step_ms.append((t1 - t0) * 1e3)
            mm_ms.append((t2 - t1) * 1e3 / 4)
    dist.barrier()
    threads_cpu = _thread_cpu()
    dist.destroy_process_group()
    out_q.put({"rank": rank, "step_ms": statistics.median(step_ms), "mm_ms": statistics.median(mm_ms),
               "threads": torch.get_num_threads(), "loss": losses[-1], "thread_cpu": threads_cpu})


def _thread_cpu():
    """Per thread of this process: name, CPU seconds, voluntary and involuntary context switches."""
    out = []
    tick = os.sysconf("SC_CLK_TCK")
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
            with open(f"/proc/self/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        fields = st[st.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        out.append((name, round(cpu, 2), int(status["voluntary_ctxt_switches"]),
                    int(status["nonvoluntary_ctxt_switches"])))
    return out


def run_job(backend, model_kind, threads, ranks, width, steps):
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    q = ctx.Queue()
    fd, path = tempfile.mkstemp(prefix="harp-bench-rdv-")
    os.close(fd)
    os.unlink(path)
    url = "file://" + path
    name, _, env = backend.partition(":")
    extra = dict(kv.split("=", 1) for kv in env.split(";") if kv)
    if threads == "omp1":  # as torchrun starts ranks: OMP_NUM_THREADS=1 in their environment
        extra["OMP_NUM_THREADS"] = "1"
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)  # spawned ranks take the environment at start
    try:
        procs = [ctx.Process(target=_rank, args=(r, ranks, name, model_kind, threads, width, steps, url, q))
                 for r in range(ranks)]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    res = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"{backend} {model_kind}: a rank failed: {[p.exitcode for p in procs]}")
    try:
        os.unlink(path)
    except OSError:
        pass
    res.sort(key=lambda r: r["rank"])
    return {"step_ms": max(r["step_ms"] for r in res), "mm_ms": statistics.median(r["mm_ms"] for r in res),
            "torch_threads": res[0]["threads"], "loss": res[0]["loss"], "thread_cpu": res[0]["thread_cpu"]}


def _busy(stop):
    while not stop.is_set():
        sum(i * i for i in range(10000))


def stamp():
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"commit": commit, "cpu": cpu, "cores": os.cpu_count(), "load": os.getloadavg(),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "argv": sys.argv}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="harp,gloo",
                    help="comma list of NAME[:VAR=VALUE;...] (a variant runs with those environment variables)")
    ap.add_argument("--model", default="fsdp,ddp")
    ap.add_argument("--threads", default="default,1", help="comma list: 'default' (torch's own), 'omp1' (OMP_NUM_THREADS=1 in the ranks' "
                         "environment, as torchrun sets it) or a number (torch.set_num_threads)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the job")
    ap.add_argument("--json", help="write rows and summary here")
    ap.add_argument("--threads-cpu", action="store_true", help="print rank 0's per-thread CPU and switches")
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    stop = mp.Event()
    hogs = [mp.Process(target=_busy, args=(stop,), daemon=True) for _ in range(args.load)]
    for h in hogs:
        h.start()
    rows = []
    try:
        for rep in range(args.repeats):
            for model_kind in args.model.split(","):
                for threads in args.threads.split(","):
                    order = backends if rep % 2 == 0 else backends[::-1]
                    for be in order:
                        r = run_job(be, model_kind, threads, args.ranks, args.width, args.steps)
                        r.update(backend=be, model=model_kind, threads=threads, rep=rep)
                        rows.append(r)
                        print(f"rep {rep} {model_kind:4s} threads={threads:7s} {be:5s} "
                              f"step {r['step_ms']:7.2f} ms  matmul {r['mm_ms']:6.3f} ms  "
                              f"(torch threads {r['torch_threads']}, loss {r['loss']:.6f})", flush=True)
                        if args.threads_cpu:
                            for t in r["thread_cpu"]:
                                print(f"    {t[0]:16s} cpu {t[1]:6.2f} s  switches {t[2]:7d} vol {t[3]:6d} invol")
    finally:
        stop.set()
        for h in hogs:
            h.join(5)
    summary = []
    if "harp" in backends and "gloo" in backends:
        for model_kind in args.model.split(","):
            for threads in args.threads.split(","):
                ratios, mm = [], []
                for rep in range(args.repeats):
                    sel = {r["backend"]: r for r in rows
                           if r["model"] == model_kind and r["threads"] == threads and r["rep"] == rep}
                    ratios.append(sel["harp"]["step_ms"] / sel["gloo"]["step_ms"])
                    mm.append(sel["harp"]["mm_ms"] / sel["gloo"]["mm_ms"])
                s = {"model": model_kind, "threads": threads, "step_ratio_min": min(ratios),
                     "step_ratio_median": statistics.median(ratios), "step_ratio_max": max(ratios),
                     "matmul_ratio_median": statistics.median(mm)}
                summary.append(s)
                print(f"{model_kind:4s} threads={threads:7s} harp/gloo step: min {s['step_ratio_min']:.2f} "
                      f"median {s['step_ratio_median']:.2f} max {s['step_ratio_max']:.2f}; "
                      f"matmul median {s['matmul_ratio_median']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stamp": stamp(), "args": vars(args), "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
