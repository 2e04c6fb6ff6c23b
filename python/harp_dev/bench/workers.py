"""harp-bench workers: one process per rank runs the sweep through one library.

    python -m harp_dev.bench.workers harp  <json-args>   (launched by harp-run or any launcher)
    python -m harp_dev.bench.workers gloo  <json-args>   (torch.distributed + gloo; env:// rendezvous)
    python -m harp_dev.bench.workers mpi   <json-args>   (mpi4py under mpirun)

Each worker times `iters` back-to-back calls after `warmup` calls (and a barrier),
for the out-of-place and the in-place form, averages the time over ranks, and
checks the results of one extra call when check is on, with numpy, against the
expected output computed locally (check.py). Every rank writes its own rows,
times and wrong counts, to args["out"] + ".rank<r>"; harp-bench merges them,
so no result of the check passes through the library being measured.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from . import check, sweep


class Lib:
    """The calls a sweep needs, per library. Buffers are numpy arrays."""

    name = "?"
    in_place_only = ()

    def describe(self, coll, count, dtype):
        """What carried this size: {"transport", "algo"} where the library can say."""
        return {}

    def run(self, coll, send, recv, in_place, op, root):
        raise NotImplementedError

    def close(self):
        pass


def _time(fn, iters, warmup, barrier):
    for _ in range(warmup):
        fn()
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / max(iters, 1) * 1e6


class Case:
    """One size of one collective on this rank: the buffers, and per form ("oop", "ip") the call
    through a library, the reset of in-place inputs, and the numpy check of the output."""

    def __init__(self, a, size, rank, nranks):
        self.dtype = sweep.numpy_dtype(a["dtype"])
        self.coll, self.op, self.root, self.rank, self.nranks = a["coll"], a["op"], a["root"], rank, nranks
        self.ns, self.nr, self.count = sweep.counts(self.coll, size, self.dtype.itemsize, nranks)
        self.send = np.empty(self.ns, dtype=self.dtype)
        sweep.fill(self.send, rank)
        self.recv = np.zeros(self.nr, dtype=self.dtype)
        self.ip_buf = np.empty(max(self.ns, self.nr), dtype=self.dtype)

    def call(self, lib, mode):
        if mode == "ip":
            return lambda: lib.run(self.coll, self.ip_buf, self.ip_buf, True, self.op, self.root, self.ns, self.nr)
        return lambda: lib.run(self.coll, self.send, self.recv, False, self.op, self.root, self.ns, self.nr)

    def prime(self, mode):
        """Reset in-place inputs (a call overwrites them)."""
        if mode != "ip":
            return
        if self.coll == "allgather":
            self.ip_buf[:] = 0
            self.ip_buf[self.rank * self.ns:(self.rank + 1) * self.ns] = self.send
        else:
            self.ip_buf[:self.ns] = self.send

    def check(self, lib, mode):
        """(wrong values, note) of one fresh call, checked here with numpy."""
        self.prime(mode)
        out = self.call(lib, mode)()
        return check.count_wrong(out, self.coll, self.nranks, self.rank, self.dtype, self.ns, self.nr,
                                 self.op, self.root)


def run_sweep(lib, a, rank, nranks, barrier, avg_time):
    """Rows for this rank. Times go through avg_time (identity: this rank's own; the
    caller merges). Wrong counts are always this rank's own, checked with numpy."""
    rows = []
    sizes = sweep.sizes(a["minbytes"], a["maxbytes"], a["factor"], a["step"])
    for i, size in enumerate(sizes):
        c = Case(a, size, rank, nranks)
        row = {"size": size, "count": c.count}
        for mode in ("oop", "ip"):
            row[f"{mode}_us"] = row[f"{mode}_wrong"] = None
            if not lib.supports(c.coll, mode == "ip"):
                continue
            c.prime(mode)
            row[f"{mode}_us"] = avg_time(_time(c.call(lib, mode), a["iters"], a["warmup"], barrier))
            if a["check"]:
                row[f"{mode}_wrong"], note = c.check(lib, mode)
                if note:
                    row[f"{mode}_note"] = note
        row.update(lib.describe(c.coll, c.count, a["dtype"]))
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

    def __init__(self, a, comm=None):
        import harp

        self.comm = comm or harp.init(transport=a.get("transport"))
        self.algo = a.get("algo") or ""
        self.rank, self.size = self.comm.rank, self.comm.size

    def supports(self, coll, in_place):
        return True

    def close(self):
        self.comm.destroy()

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
        if coll == "alltoall":
            count //= self.size  # nccl-tests' count is the whole buffer; HARP's alltoall count is one block
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
            c.alltoall(send[:ns], send[:ns] if in_place else recv, algo=self.algo)
            return send if in_place else recv
        raise ValueError(coll)


# ---------------------------------------------------------------------------- gloo
class GlooLib(Lib):
    """torch.distributed with the gloo backend (env:// rendezvous)."""

    name = "gloo"
    backend = "gloo"

    def __init__(self, a, group=None):
        """group: an existing process group of this backend (interleaved runs); else the default
        group is initialised from the env:// variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        # torch's intra-op threads spin after parallel regions and take CPU from the ranks.
        torch.set_num_threads(1)
        self.group, self.own = group, group is None
        if group is None:
            if self.backend == "harp":
                import harp.torch  # noqa: F401  (registers the backend)
            dist.init_process_group(self.backend)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
                    "max": dist.ReduceOp.MAX, "avg": getattr(dist.ReduceOp, "AVG", None)}

    def supports(self, coll, in_place):
        # gloo's collectives are in place (allreduce/broadcast/reduce) or out of place only.
        if coll in ("allreduce", "broadcast", "reduce"):
            return in_place
        return not in_place

    def close(self):
        if self.own:
            self.dist.destroy_process_group()

    def barrier(self):
        self.dist.barrier(group=self.group)

    def avg(self, x):
        t = self.torch.tensor([x], dtype=self.torch.float64)
        self.dist.all_reduce(t, group=self.group)
        return float(t[0]) / self.size

    def run(self, coll, send, recv, in_place, op, root, ns, nr):
        torch, dist, g = self.torch, self.dist, self.group
        s = torch.from_numpy(send)
        if coll == "allreduce":
            dist.all_reduce(s, op=self.ops[op], group=g)
            return send
        if coll == "broadcast":
            dist.broadcast(s, root, group=g)
            return send
        if coll == "reduce":
            dist.reduce(s[:ns], root, op=self.ops[op], group=g)
            return send
        r = torch.from_numpy(recv)
        if coll == "allgather":
            dist.all_gather_into_tensor(r, s, group=g)
            return recv
        if coll == "reduce_scatter":
            dist.reduce_scatter_tensor(r, s, op=self.ops[op], group=g)
            return recv
        if coll == "alltoall":
            dist.all_to_all_single(r, s, group=g)
            return recv
        raise ValueError(coll)


# ---------------------------------------------------------------------------- MPI
class MpiLib(Lib):
    name = "mpi"

    def __init__(self, a, comm=None):
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


class TorchHarpLib(GlooLib):
    """torch.distributed over HARP's backend ("torch+harp": the torch path's cost on top of HARP)."""

    name = "torch+harp"
    backend = "harp"

    def supports(self, coll, in_place):
        # The same forms as gloo, so the torch path compares like for like.
        return GlooLib.supports(self, coll, in_place)


LIBS = {"harp": HarpLib, "gloo": GlooLib, "mpi": MpiLib, "torch+harp": TorchHarpLib}


def main():
    which, args = sys.argv[1], json.loads(sys.argv[2])
    lib = LIBS[which](args)
    rows = run_sweep(lib, args, lib.rank, lib.size, lib.barrier, lambda x: x)
    check.write_rank(args["out"], which, lib.rank, lib.size, rows)
    lib.close()


if __name__ == "__main__":
    main()
