"""Correctness of every collective against numpy, run inside each rank.

`check_everything(comm, sizes, algos)` runs every collective for every dtype,
op, algorithm, size, root, in-place and out-of-place, computes what numpy says
each rank must hold, and returns a list of failure descriptions (empty = all
right). Shared by the TCP tests and the other transports' tests.
"""
from __future__ import annotations

import os

import numpy as np

import harp

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BF16 = None

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64, np.bool_]
if BF16 is not None:
    DTYPES.append(BF16)
DTYPES = [np.dtype(d) for d in DTYPES]
FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)} | ({BF16} if BF16 is not None else set())
ARITH_OPS = ["sum", "prod", "min", "max", "avg"]
BIT_OPS = ["band", "bor", "bxor"]


def hosts_env(layout):
    """Fake hosts on one machine: layout [2, 2] -> HARP_HOSTID per rank ["h0", "h0", "h1", "h1"]."""
    return [f"h{h}" for h, n in enumerate(layout) for _ in range(n)]


def init_as(rank, ids):
    """harp.init() as a rank of the fake host ids[rank] (hosts_env); ids None: the real host."""
    if ids is not None:
        os.environ["HARP_HOSTID"] = ids[rank]
    return harp.init()


def registered_algorithms(coll):
    """The algorithm names the library registers for `coll` (harp._harp.algorithms), in its order."""
    return [a.strip() for a in harp._harp.algorithms(coll).split(",") if a.strip()]


# Every registered allreduce algorithm, taken from the registry (never listed
# here): a new algorithm joins every matrix that uses this list. One that needs
# a transport the communicator lacks (shm) runs its declared fallback there.
ALLREDUCE_ALGOS = registered_algorithms("allreduce")


def ops_for(dt):
    if dt == np.bool_:
        return ["sum", "prod", "min", "max"] + BIT_OPS
    if dt in FLOATS:
        return ARITH_OPS
    return ARITH_OPS + BIT_OPS


def data(rank, n, dt, salt=0):
    """Deterministic per-rank input: small values so sums/products stay exact-ish in every dtype."""
    i = np.arange(n, dtype=np.int64)
    v = (i * 31 + rank * 17 + salt * 7) % 3 + 1  # 1..3
    if dt == np.bool_:
        return ((i + rank + salt) % 3 == 0)
    if dt.kind == "i":
        v = np.where((i + rank) % 4 == 0, -v, v)  # negatives too
    return v.astype(dt)


def reference(inputs, dt, op, size):
    """numpy's answer for reducing `inputs` (one array per rank) with op."""
    if dt == np.bool_:
        st = np.stack(inputs)
        if op in ("sum", "max", "bor"):
            return st.any(0)
        if op in ("prod", "min", "band"):
            return st.all(0)
        if op == "bxor":
            return np.logical_xor.reduce(st, 0)
    if dt in FLOATS:
        st = np.stack([x.astype(np.float64) for x in inputs])
        return {"sum": st.sum(0), "prod": st.prod(0), "min": st.min(0), "max": st.max(0),
                "avg": st.sum(0) / size}[op]
    # integers: wrap-around arithmetic in the dtype itself, like HARP
    acc = inputs[0].copy()
    for x in inputs[1:]:
        if op in ("sum", "avg"):
            acc = (acc + x).astype(dt)
        elif op == "prod":
            acc = (acc * x).astype(dt)
        elif op == "min":
            acc = np.minimum(acc, x)
        elif op == "max":
            acc = np.maximum(acc, x)
        elif op == "band":
            acc = acc & x
        elif op == "bor":
            acc = acc | x
        elif op == "bxor":
            acc = acc ^ x
    if op == "avg":
        acc = (np.trunc(acc.astype(np.float64) / size)).astype(dt) if dt.kind == "i" else (acc // size).astype(dt)
    return acc


def same(got, exp, dt, nops=1):
    if dt in FLOATS:
        tol = {2: 4e-2 if dt == BF16 else 4e-3, 4: 1e-5, 8: 1e-12}[dt.itemsize] * max(1, nops)
        return np.allclose(got.astype(np.float64), np.asarray(exp, dtype=np.float64), rtol=tol, atol=tol)
    return np.array_equal(got, np.asarray(exp).astype(dt))


class Checker:
    def __init__(self, comm):
        self.c = comm
        self.failures = []
        self.calls = 0

    def expect(self, what, got, exp, dt, nops=1):
        self.calls += 1
        if exp is None:
            return
        if got.shape != np.asarray(exp).shape or not same(got, exp, dt, nops):
            g = np.asarray(got).ravel()[:6]
            e = np.asarray(exp).ravel()[:6]
            self.failures.append(f"rank {self.c.rank}: {what}: got {g} expected {e}")

    # ------------------------------------------------------------------ collectives
    def allreduce(self, sizes, algos):
        c = self.c
        for dt in DTYPES:
            for op in ops_for(dt):
                for n in sizes:
                    for algo in algos:
                        inputs = [data(r, n, dt) for r in range(c.size)]
                        exp = reference(inputs, dt, op, c.size)
                        x = inputs[c.rank].copy()
                        out = np.empty_like(x)
                        c.allreduce(x, out, op, algo=algo)
                        self.expect(f"allreduce {dt} {op} n={n} {algo} out-of-place", out, exp, dt, c.size)
                        self.expect(f"allreduce {dt} {op} n={n} {algo} input untouched", x, inputs[c.rank], dt)
                        c.allreduce(x, None, op, algo=algo)
                        self.expect(f"allreduce {dt} {op} n={n} {algo} in-place", x, exp, dt, c.size)

    def rooted(self, sizes):
        c = self.c
        roots = sorted({0, c.size - 1, c.size // 2})
        for dt in DTYPES:
            for n in sizes:
                for root in roots:
                    for algo in ("binomial", "pipeline"):
                        x = data(c.rank, n, dt, salt=root) if c.rank == root else np.zeros(n, dt)
                        c.broadcast(x, root, algo=algo)
                        self.expect(f"broadcast {dt} n={n} root={root} {algo}", x, data(root, n, dt, salt=root), dt)
                        for op in ops_for(dt)[:3] if n > 1000 else ops_for(dt):
                            inputs = [data(r, n, dt) for r in range(c.size)]
                            exp = reference(inputs, dt, op, c.size)
                            mine = inputs[c.rank].copy()
                            out = np.full(n, 0, dtype=dt)
                            c.reduce(mine, out, op, root, algo=algo)
                            if c.rank == root:
                                self.expect(f"reduce {dt} {op} n={n} root={root} {algo}", out, exp, dt, c.size)
                            self.expect(f"reduce {dt} {op} input untouched", mine, inputs[c.rank], dt)
                            if algo == "binomial":  # in place at the root
                                mine2 = inputs[c.rank].copy()
                                c.reduce(mine2, None, op, root)
                                if c.rank == root:
                                    self.expect(f"reduce in-place {dt} {op} n={n} root={root}", mine2, exp, dt, c.size)
                    # gather / scatter
                    g = c.gather(data(c.rank, n, dt), None, root)
                    if c.rank == root:
                        self.expect(f"gather {dt} n={n} root={root}", g,
                                    np.stack([data(r, n, dt) for r in range(c.size)]), dt)
                    else:
                        self.calls += 1
                        if g is not None:
                            self.failures.append(f"gather returned data on non-root rank {c.rank}")
                    src = np.concatenate([data(r, n, dt, salt=5) for r in range(c.size)]) if c.rank == root else None
                    out = np.zeros(n, dtype=dt)
                    c.scatter(src, out, root)
                    self.expect(f"scatter {dt} n={n} root={root}", out, data(c.rank, n, dt, salt=5), dt)

    def gathers(self, sizes):
        c = self.c
        p = c.size
        for dt in DTYPES:
            for n in sizes:
                allin = np.stack([data(r, n, dt) for r in range(p)])
                # allgather out-of-place and in-place (NCCL rule: input is block `rank` of the output)
                for algo in ("ring", "direct"):
                    self.expect(f"allgather {dt} n={n} {algo}", c.allgather(data(c.rank, n, dt), algo=algo), allin,
                                dt)
                    buf = np.zeros(p * n, dtype=dt)
                    buf[c.rank * n:(c.rank + 1) * n] = data(c.rank, n, dt)
                    c.allgather(buf[c.rank * n:(c.rank + 1) * n], buf, algo=algo)
                    self.expect(f"allgather in-place {dt} n={n} {algo}", buf, allin.ravel(), dt)
                # reduce_scatter, every op
                for op in ops_for(dt):
                    inputs = [data(r, p * n, dt, salt=3) for r in range(p)]
                    full = reference(inputs, dt, op, p)
                    exp = np.asarray(full)[c.rank * n:(c.rank + 1) * n]
                    got = c.reduce_scatter(inputs[c.rank].copy(), None, op)
                    self.expect(f"reduce_scatter {dt} {op} n={n}", got, exp, dt, p)
                    ip = inputs[c.rank].copy()
                    c.reduce_scatter(ip, ip[c.rank * n:(c.rank + 1) * n], op)
                    self.expect(f"reduce_scatter in-place {dt} {op} n={n}", ip[c.rank * n:(c.rank + 1) * n], exp,
                                dt, p)
                # alltoall: block q of rank r's input is data(r*1000+q)
                send = np.concatenate([data(c.rank * 100 + q, n, dt) for q in range(p)])
                exp = np.concatenate([data(q * 100 + c.rank, n, dt) for q in range(p)])
                self.expect(f"alltoall {dt} n={n}", c.alltoall(send), exp, dt)
                inplace = send.copy()
                c.alltoall(inplace, inplace)
                self.expect(f"alltoall in-place {dt} n={n}", inplace, exp, dt)
        # alltoallv with uneven counts: rank r sends (r + q) % 3 + n0 elements to q
        for n0 in (0, 5):
            sc = [(c.rank + q) % 3 + n0 for q in range(p)]
            rc = [(q + c.rank) % 3 + n0 for q in range(p)]
            send = np.concatenate([np.full(sc[q], c.rank * 10 + q, np.int32) for q in range(p)]) if sum(sc) else \
                np.zeros(0, np.int32)
            recv = np.full(sum(rc), -1, np.int32)
            c.alltoallv(send, sc, recv, rc)
            exp = np.concatenate([np.full(rc[q], q * 10 + c.rank, np.int32) for q in range(p)]) if sum(rc) else \
                np.zeros(0, np.int32)
            self.expect(f"alltoallv n0={n0}", recv, exp, np.dtype(np.int32))

    def p2p(self, sizes):
        c = self.c
        p = c.size
        if p == 1:
            return
        right, left = (c.rank + 1) % p, (c.rank - 1) % p
        for dt in (np.dtype(np.float32), np.dtype(np.int8)):
            for n in sizes:
                out = np.zeros(n, dtype=dt)
                # even ranks send first; odd receive first (no reliance on buffering)
                for step in range(2):
                    if (c.rank % 2 == 0) == (step == 0):
                        c.send(data(c.rank, n, dt), right, tag=7)
                    else:
                        c.recv(out, left, tag=7)
                if p % 2 == 1:  # odd ring: rank p-1 (even) and rank 0 (even) — handled by async below
                    pass
                self.expect(f"send/recv {dt} n={n}", out, data(left, n, dt), dt)
        # async: everyone sends right and receives left at once
        out = np.zeros(33, dtype=np.float64)
        w1 = c.send(np.full(33, c.rank, np.float64), right, async_op=True)
        w2 = c.recv(out, left, async_op=True)
        w1.wait()
        w2.wait()
        self.expect("async send/recv ring", out, np.full(33, left, np.float64), np.dtype(np.float64))
        c.barrier()


def check_everything(comm, sizes=(0, 1, 7, 1031), algos=None):
    algos = ALLREDUCE_ALGOS if algos is None else algos
    ch = Checker(comm)
    ch.allreduce(sizes, algos)
    ch.rooted(sizes)
    ch.gathers(sizes)
    if comm.size % 2 == 0:
        ch.p2p(sizes)
    else:
        ch.p2p([])  # async ring part only
    comm.barrier()
    return ch.failures, ch.calls
