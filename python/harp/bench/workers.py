"""harp-bench workers: one process per rank runs the sweep through one library.

    python -m harp.bench.workers harp  <json-args>   (launched by harp-run or any launcher)
    python -m harp.bench.workers gloo  <json-args>   (torch.distributed + gloo; env:// rendezvous)
    python -m harp.bench.workers mpi   <json-args>   (mpi4py under mpirun)

Each worker times `iters` back-to-back calls after `warmup` calls (and a barrier),
for the out-of-place and the in-place form, averages the time over ranks, and
checks the results of one extra call when check is on. Rank 0 writes the rows as
JSON to args["out"].
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from . import sweep


class Lib:
    """The calls a sweep needs, per library. Buffers are numpy arrays."""

    name = "?"
    in_place_only = ()

    def describe(self, coll, count, dtype):
        """What carried this size: {"transport", "algo"} where the library can say."""
        return {}

    def run(self, coll, send, recv, in_place, op, root):
        raise NotImplementedError


def _time(fn, iters, warmup, barrier):
    for _ in range(warmup):
        fn()
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / max(iters, 1) * 1e6


def _expected(coll, a, nranks, rank, dtype, count_send, count_recv, op, root):
    """Expected output of one call, from the fill() inputs of every rank (float64)."""
    ins = []
    for r in range(nranks):
        v = np.empty(count_send, dtype=dtype)
        sweep.fill(v, r)
        ins.append(v.astype(np.float64))
    if coll in ("allreduce", "reduce", "reduce_scatter"):
        stack = np.stack(ins)
        red = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0), "max": stack.max(0),
               "avg": stack.sum(0) / nranks}[op]
        if op == "avg" and np.issubdtype(dtype, np.integer):
            red = np.trunc(stack.sum(0) / nranks)
        if coll == "reduce_scatter":
            return red[rank * count_recv:(rank + 1) * count_recv]
        if coll == "reduce" and rank != root:
            return None
        return red
    if coll == "broadcast":
        return ins[root]
    if coll == "allgather":
        return np.concatenate(ins)
    if coll == "alltoall":
        per = count_send // nranks
        return np.concatenate([ins[q][rank * per:(rank + 1) * per] for q in range(nranks)])
    return None


def run_sweep(lib, a, rank, nranks, barrier, avg_time):
    dtype = sweep.numpy_dtype(a["dtype"])
    coll, op, root = a["coll"], a["op"], a["root"]
    rows = []
    sizes = sweep.sizes(a["minbytes"], a["maxbytes"], a["factor"], a["step"])
    for i, size in enumerate(sizes):
        ns, nr, count = sweep.counts(coll, size, dtype.itemsize, nranks)
        row = {"size": size, "count": count}
        send = np.empty(ns, dtype=dtype)
        sweep.fill(send, rank)
        recv = np.zeros(nr, dtype=dtype)
        ip_buf = np.empty(max(ns, nr), dtype=dtype)
        for mode in ("oop", "ip"):
            in_place = mode == "ip"
            if not lib.supports(coll, in_place):
                row[f"{mode}_us"] = None
                row[f"{mode}_wrong"] = None
                continue

            def call():
                if in_place:
                    return lib.run(coll, ip_buf, ip_buf, True, op, root, ns, nr)
                return lib.run(coll, send, recv, False, op, root, ns, nr)

            def prime():
                # Reset in-place inputs (a call overwrites them).
                if in_place:
                    if coll == "allgather":
                        ip_buf[:] = 0
                        ip_buf[rank * ns:(rank + 1) * ns] = send
                    else:
                        ip_buf[:ns] = send

            prime()
            us = _time(call, a["iters"], a["warmup"], barrier)
            row[f"{mode}_us"] = avg_time(us)
            wrong = None
            if a["check"]:
                prime()
                out = call()
                exp = _expected(coll, a, nranks, rank, dtype, ns, nr, op, root)
                if exp is None:
                    wrong = 0
                else:
                    got = np.asarray(out)[: exp.size].astype(np.float64)
                    wrong = int(np.count_nonzero(~np.isclose(got, exp, rtol=1e-2 if dtype.itemsize <= 2 else 1e-5)))
                wrong = int(avg_time(float(wrong)) * nranks + 0.5)
            row[f"{mode}_wrong"] = wrong
        row.update(lib.describe(coll, count, a["dtype"]))
        rows.append(row)
        if rank == 0:
            _progress(a.get("progress"), lib.name, i + 1, len(sizes), size)
    if rank == 0 and a.get("progress") == "tty":
        print(file=sys.stderr)
    return rows


def _progress(mode, name, done, total, size):
    """'tty': one self-overwriting line (\\r); 'lines': a plain line per size (logs, pipes); else nothing."""
    if mode == "tty":
        print(f"\r[{name}] {done}/{total} sizes", end="", file=sys.stderr, flush=True)
    elif mode == "lines":
        print(f"[{name}] {done}/{total} sizes ({size} B done)", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- HARP
class HarpLib(Lib):
    name = "harp"

    def __init__(self, a):
        import harp

        self.comm = harp.init(transport=a.get("transport"))
        self.algo = a.get("algo") or ""
        self.rank, self.size = self.comm.rank, self.comm.size

    def supports(self, coll, in_place):
        return True

    def barrier(self):
        self.comm.barrier()

    def avg(self, x):
        v = np.array([x], dtype=np.float64)
        self.comm.allreduce(v)
        return float(v[0]) / self.size

    def transports(self):
        """The transports this rank's peers are reached by, e.g. "shm" or "shm+tcp"."""
        names = sorted({self.comm.transport(p) for p in range(self.size) if p != self.rank})
        return "+".join(names) or "self"

    def describe(self, coll, count, dtype):
        # The algorithm the communicator picks for this call (HARP_ALGO and --algo included).
        try:
            algo = self.algo or self.comm.algorithm(coll, count, dtype)
        except Exception as e:  # a dtype the tuning query does not know: say so, keep measuring
            algo = f"? ({e})"
        return {"transport": self.transports(), "algo": algo}

    def run(self, coll, send, recv, in_place, op, root, ns, nr):
        c = self.comm
        if coll == "allreduce":
            c.allreduce(send, None if in_place else recv, op, algo=self.algo)
            return send if in_place else recv
        if coll == "broadcast":
            if not in_place and c.rank == root:
                recv[:] = send
            buf = send if in_place else recv
            c.broadcast(buf, root, algo=self.algo)
            return buf
        if coll == "reduce":
            c.reduce(send[:ns] if in_place else send, None if in_place else recv, op, root, algo=self.algo)
            return send if in_place else recv
        if coll == "allgather":
            per = ns
            if in_place:
                c.allgather(send[c.rank * per:(c.rank + 1) * per], send[: per * c.size], algo=self.algo)
                return send
            c.allgather(send, recv, algo=self.algo)
            return recv
        if coll == "reduce_scatter":
            if in_place:
                # NCCL's in-place rule: the output is block `rank` of the input buffer (a view).
                out = send[c.rank * nr:(c.rank + 1) * nr]
                c.reduce_scatter(send[: nr * c.size], out, op, algo=self.algo)
                return out
            c.reduce_scatter(send, recv, op, algo=self.algo)
            return recv
        if coll == "alltoall":
            c.alltoall(send[:ns], send[:ns] if in_place else recv)
            return send if in_place else recv
        raise ValueError(coll)


# ---------------------------------------------------------------------------- gloo
class GlooLib(Lib):
    name = "gloo"

    def __init__(self, a):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                    "max": dist.ReduceOp.MAX, "avg": getattr(dist.ReduceOp, "AVG", None)}

    def supports(self, coll, in_place):
        # gloo's collectives are in place (allreduce/broadcast/reduce) or out of place only.
        if coll in ("allreduce", "broadcast", "reduce"):
            return in_place
        return not in_place

    def barrier(self):
        self.dist.barrier()

    def avg(self, x):
        t = self.torch.tensor([x], dtype=self.torch.float64)
        self.dist.all_reduce(t)
        return float(t[0]) / self.size

    def run(self, coll, send, recv, in_place, op, root, ns, nr):
        torch, dist = self.torch, self.dist
        s = torch.from_numpy(send)
        if coll == "allreduce":
            dist.all_reduce(s, op=self.ops[op])
            return send
        if coll == "broadcast":
            dist.broadcast(s, root)
            return send
        if coll == "reduce":
            dist.reduce(s[:ns], root, op=self.ops[op])
            return send
        r = torch.from_numpy(recv)
        if coll == "allgather":
            dist.all_gather_into_tensor(r, s)
            return recv
        if coll == "reduce_scatter":
            dist.reduce_scatter_tensor(r, s, op=self.ops[op])
            return recv
        if coll == "alltoall":
            dist.all_to_all_single(r, s)
            return recv
        raise ValueError(coll)


# ---------------------------------------------------------------------------- MPI
class MpiLib(Lib):
    name = "mpi"

    def __init__(self, a):
        from mpi4py import MPI

        self.MPI = MPI
        self.c = MPI.COMM_WORLD
        self.rank, self.size = self.c.Get_rank(), self.c.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def supports(self, coll, in_place):
        return True

    def barrier(self):
        self.c.Barrier()

    def avg(self, x):
        return self.c.allreduce(x) / self.size

    def run(self, coll, send, recv, in_place, op, root, ns, nr):
        c, MPI = self.c, self.MPI
        IP = MPI.IN_PLACE
        if coll == "allreduce":
            if in_place:
                c.Allreduce(IP, send, op=self.ops[op])
                return send
            c.Allreduce(send, recv, op=self.ops[op])
            return recv
        if coll == "broadcast":
            if not in_place:
                if c.rank == root:
                    recv[:] = send
                c.Bcast(recv, root)
                return recv
            c.Bcast(send, root)
            return send
        if coll == "reduce":
            if in_place:
                c.Reduce(IP if c.rank == root else send[:ns], send[:ns] if c.rank == root else None, self.ops[op], root)
                return send
            c.Reduce(send, recv, self.ops[op], root)
            return recv
        if coll == "allgather":
            if in_place:
                c.Allgather(IP, send[: ns * self.size])
                return send
            c.Allgather(send, recv)
            return recv
        if coll == "reduce_scatter":
            if in_place:
                c.Reduce_scatter_block(IP, send[: nr * self.size], op=self.ops[op])
                return send[:nr]
            c.Reduce_scatter_block(send, recv, op=self.ops[op])
            return recv
        if coll == "alltoall":
            if in_place:
                c.Alltoall(IP, send[:ns])
                return send
            c.Alltoall(send, recv)
            return recv
        raise ValueError(coll)


LIBS = {"harp": HarpLib, "gloo": GlooLib, "mpi": MpiLib}


def main():
    which, args = sys.argv[1], json.loads(sys.argv[2])
    lib = LIBS[which](args)
    rows = run_sweep(lib, args, lib.rank, lib.size, lib.barrier, lib.avg)
    if lib.rank == 0:
        with open(args["out"], "w") as f:
            used = sorted({r["transport"] for r in rows if r.get("transport")})
            json.dump({"lib": which, "nranks": lib.size, "transport": "+".join(used) or which, "rows": rows}, f)
    if which == "harp":
        lib.comm.destroy()
    elif which == "gloo":
        lib.dist.destroy_process_group()


if __name__ == "__main__":
    main()
