"""HARP vs Open MPI vs gloo on one host, interleaved in the same processes.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
    mpirun -np 4 --oversubscribe --bind-to none python bench/shm_compare.py --json out.json

Every rank is one process that runs all three libraries: Open MPI through
mpi4py (this job: its shared-memory btl, vader/sm), HARP (harp.init() over the
bootstrap address rank 0 broadcasts; transport chosen automatically = shm) and
gloo (torch.distributed, TCP on loopback). For each size the libraries take
turns, batch by batch (order rotated every repetition), and the reported time
is the median batch, so load that comes and goes on a shared machine hits all
three alike. Float32, sum. --coll allreduce (default; in place, the form all
three support), allgather (size = the output), reduce_scatter (size = the
input), broadcast (root 0, in place).
Time per call = the slowest rank's batch time / iterations; busbw = size/time x
2(N-1)/N for allreduce, (N-1)/N for allgather and reduce_scatter, 1 for
broadcast (nccl-tests). A STREAM-like copy (numpy copyto of 256 MB arrays, all
ranks at once; bytes read + written) is measured in the same run, before and
after the sweep, as the memory-bandwidth reference. Results are checked once
per size and library against the exact sum.
"""
import argparse
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_size(s):
    s = s.upper()
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * m[s[-1]]) if s[-1] in m else int(s)


def stream_copy(comm, mb=256, reps=5):
    a = np.ones((mb << 20) // 8)
    b = np.zeros_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(reps):
        comm.Barrier()
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    mine = 2 * a.nbytes / best / 1e9
    del a, b
    sa, sb = np.ones(1 << 17), np.zeros(1 << 17)
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(200):
        np.copyto(sb, sa)
    small = 2 * sa.nbytes * 200 / (time.perf_counter() - t) / 1e9
    return comm.allreduce(mine), comm.allreduce(small)


def _inputs(count, rank, fill):
    return ((np.arange(count) % 13) + rank).astype(np.float32) if fill else np.zeros(count, np.float32)


def _sum(count, n):
    """The sum over n ranks of _inputs(count, rank, True)."""
    return ((np.arange(count) % 13) * n + n * (n - 1) / 2).astype(np.float32)


def c_allreduce(lib, h, count, rank, n, fill=False):
    x = _inputs(count, rank, fill)
    exp = _sum(count, n)
    if lib == "harp":
        return (lambda: h.allreduce(x)), exp
    if lib == "mpi":
        return (lambda: (h.Allreduce(MPI.IN_PLACE, x), x)[1]), exp
    dist, torch = h
    t = torch.from_numpy(x)
    return (lambda: (dist.all_reduce(t), x)[1]), exp


def c_allgather(lib, h, count, rank, n, fill=False):
    send, out = _inputs(count // n, rank, fill), np.zeros(count, np.float32)
    exp = np.concatenate([_inputs(count // n, r, True) for r in range(n)])
    if lib == "harp":
        return (lambda: h.allgather(send, out)), exp
    if lib == "mpi":
        return (lambda: (h.Allgather(send, out), out)[1]), exp
    dist, torch = h
    ts, to = torch.from_numpy(send), torch.from_numpy(out)
    return (lambda: (dist.all_gather_into_tensor(to, ts), out)[1]), exp


def c_reduce_scatter(lib, h, count, rank, n, fill=False):
    send, out = _inputs(count, rank, fill), np.zeros(count // n, np.float32)
    exp = _sum(count, n)[rank * (count // n):(rank + 1) * (count // n)]
    if lib == "harp":
        return (lambda: h.reduce_scatter(send, out)), exp
    if lib == "mpi":
        return (lambda: (h.Reduce_scatter_block(send, out, op=MPI.SUM), out)[1]), exp
    dist, torch = h
    ts, to = torch.from_numpy(send), torch.from_numpy(out)
    return (lambda: (dist.reduce_scatter_tensor(to, ts), out)[1]), exp


def c_broadcast(lib, h, count, rank, n, fill=False):
    x = _inputs(count, rank, fill)
    exp = _inputs(count, 0, True)
    if lib == "harp":
        return (lambda: h.broadcast(x, 0)), exp
    if lib == "mpi":
        return (lambda: (h.Bcast(x, root=0), x)[1]), exp
    dist, torch = h
    t = torch.from_numpy(x)
    return (lambda: (dist.broadcast(t, 0), x)[1]), exp


# --coll name -> fn(lib, handle, count, rank, nranks, fill) -> (call returning the output, expected output)
COLLS = {"allreduce": c_allreduce, "allgather": c_allgather, "reduce_scatter": c_reduce_scatter,
         "broadcast": c_broadcast}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="64M")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-iters", dest="max_iters", type=int, default=200, help="calls per batch for small sizes")
    ap.add_argument("--libs", default="harp,mpi,gloo")
    ap.add_argument("--coll", default="allreduce", choices=sorted(COLLS))
    ap.add_argument("--json")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.rank, comm.size
    libs = a.libs.split(",")

    # --- set up the three libraries in every rank
    if rank == 0:
        ports = []
        for _ in range(2):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
            s.close()
        secret = os.urandom(8).hex()
    else:
        ports, secret = None, None
    ports, secret = comm.bcast((ports, secret), root=0)
    impl = {}
    if "harp" in libs:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import harp
        os.environ.update(HARP_RANK=str(rank), HARP_WORLD_SIZE=str(n), HARP_ADDR=f"127.0.0.1:{ports[0]}",
                          HARP_SECRET=secret)
        hc = harp.init()
        impl["harp"] = hc
        transports = sorted({hc.transport(p) for p in range(n) if p != rank})
    if "gloo" in libs:
        import torch
        import torch.distributed as dist
        # torch's intra-op (OpenMP) threads spin after each parallel region and would
        # take CPU from whichever library runs next in this process; gloo's
        # allreduce does not need them.
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank, world_size=n)

        impl["gloo"] = (dist, torch)
    if "mpi" in libs:
        impl["mpi"] = comm

    copy_before = stream_copy(comm)
    sizes = []
    s = max(parse_size(a.b), 8)
    while s <= parse_size(a.e):
        sizes.append(s)
        s *= 2
    rows = []
    factor = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "broadcast": 1.0}[a.coll]
    for size in sizes:
        count = size // 4
        if a.coll in ("allgather", "reduce_scatter"):
            count -= count % n
            if count == 0:
                continue
        # correctness, once per library
        ok = {}
        for lib in libs:
            call, expected = COLLS[a.coll](lib, impl[lib], count, rank, n, fill=True)
            out = call()
            ok[lib] = bool(comm.allreduce(int(np.array_equal(out, expected)), op=MPI.MIN))
        calls = {lib: COLLS[a.coll](lib, impl[lib], count, rank, n)[0] for lib in libs}
        # Enough calls per batch that one batch is not one cache state (>= 5, ~64 MB moved).
        iters = int(max(5, min(a.max_iters, (64 << 20) // size)))
        for lib in libs:  # warm up
            for _ in range(max(1, iters // 4)):
                calls[lib]()
        times = {lib: [] for lib in libs}
        for rep in range(a.reps):
            order = libs[rep % len(libs):] + libs[:rep % len(libs)]
            for lib in order:
                comm.Barrier()
                t = time.perf_counter()
                call = calls[lib]
                for _ in range(iters):
                    call()
                dt = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
                times[lib].append(dt / iters)
        row = {"size": size, "iters": iters}
        for lib in libs:
            med = float(np.median(times[lib]))
            alg = size / med / 1e9
            row[lib] = {"us": med * 1e6, "min_us": min(times[lib]) * 1e6, "busbw": alg * factor,
                        "ok": ok[lib]}
        rows.append(row)
        if rank == 0:
            print(f"# {size:>9d} " + " ".join(f"{lib} {row[lib]['us']:9.2f}us {row[lib]['busbw']:6.3f}GB/s"
                                               for lib in libs), file=sys.stderr, flush=True)
    copy_after = stream_copy(comm)
    if rank == 0:
        print(f"## {a.coll} float32 sum, {n} ranks, one host; median of {a.reps} interleaved batches; "
              f"HARP transport(s): {','.join(transports) if 'harp' in libs else '-'}")
        print(f"## STREAM-like copy (all {n} ranks at once, read+write): before {copy_before[0]:.2f} GB/s, "
              f"after {copy_after[0]:.2f} GB/s; 1 MB in-cache block: {copy_before[1]:.2f} / {copy_after[1]:.2f} GB/s")
        head = "| size | " + " | ".join(f"{lib} us | {lib} busbw GB/s" for lib in libs)
        if "harp" in libs:
            head += " | " + " | ".join(f"harp/{lib} speed-up" for lib in libs if lib != "harp")
        print(head + " |")
        print("|" + "---|" * (1 + 2 * len(libs) + (len(libs) - 1 if "harp" in libs else 0)))
        for r in rows:
            line = f"| {r['size']} | " + " | ".join(
                f"{r[lib]['us']:.2f}{'' if r[lib]['ok'] else ' WRONG'} | {r[lib]['busbw']:.3f}" for lib in libs)
            if "harp" in libs:
                line += " | " + " | ".join(f"{r[lib]['us'] / r['harp']['us']:.2f}x" for lib in libs if lib != "harp")
            print(line + " |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"coll": a.coll, "nranks": n, "reps": a.reps, "copy_before": copy_before, "copy_after": copy_after,
                           "rows": rows}, f, indent=1)
    comm.Barrier()
    if "harp" in libs:
        hc.destroy()
    if "gloo" in libs:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
