"""harp-bench result checking, independent of the library measured.

Every rank of every worker (HARP, gloo, Open MPI, torch+harp) computes the
expected output of each call itself, with numpy, from the inputs every rank
uses (sweep.fill), and counts the values that differ. Nothing about the check
travels through the library being measured:

  * harp-bench's own ranks (it spawned them) each write their rows, wrong
    counts included, to a file of their own (OUT.rank<r>); the CLI merges the
    files (`merge`): times are averaged over ranks, wrong counts summed, and a
    rank that wrote no file is a failure.
  * under someone else's launcher (harp-run, torchrun, mpirun) every rank that
    saw a wrong value says so on stderr and exits 1 (`exit_status`), so the
    launcher's own exit status carries the verdict.

`failures(results)` names every library, size and form (out-of-place,
in-place) with wrong values; harp-bench prints them and exits 1.
"""
from __future__ import annotations

import json
import os

import numpy as np

from . import sweep


def expected(coll, nranks, rank, dtype, count_send, count_recv, op, root):
    """Expected output of one call on `rank`, from the fill() inputs of every rank (float64);
    None where the rank has no defined output (reduce on a non-root)."""
    ins = []
    for r in range(nranks):
        v = np.empty(count_send, dtype=dtype)
        sweep.fill(v, r)
        ins.append(v.astype(np.float64))
    if coll in ("allreduce", "reduce", "reduce_scatter"):
        if coll == "reduce" and rank != root:
            return None
        red = _reduce(np.stack(ins), op, nranks, dtype)
        if coll == "reduce_scatter":
            return red[rank * count_recv:(rank + 1) * count_recv]
        return red
    if coll == "broadcast":
        return ins[root]
    if coll == "allgather":
        return np.concatenate(ins)
    if coll == "alltoall":
        per = count_send // nranks
        return np.concatenate([ins[q][rank * per:(rank + 1) * per] for q in range(nranks)])
    raise ValueError(f"harp-bench: no expected value for collective '{coll}'")


def _reduce(stack, op, nranks, dtype):
    if op == "avg":
        s = stack.sum(0) / nranks
        return np.trunc(s) if np.issubdtype(dtype, np.integer) else s
    return {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0), "max": stack.max(0)}[op]


def count_wrong(out, exp, dtype):
    """(number of wrong values, "first wrong: [i] = got, expected exp" or "") for one output."""
    if exp is None:
        return 0, ""
    got = np.asarray(out).reshape(-1)[: exp.size].astype(np.float64)
    if got.size != exp.size:
        return exp.size, f"output has {got.size} values, expected {exp.size}"
    bad = ~np.isclose(got, exp, rtol=1e-2 if np.dtype(dtype).itemsize <= 2 else 1e-5)
    n = int(np.count_nonzero(bad))
    if not n:
        return 0, ""
    i = int(np.flatnonzero(bad)[0])
    return n, f"first wrong: [{i}] = {float(got[i]):g}, expected {float(exp[i]):g}"


def rank_file(out, rank):
    return f"{out}.rank{rank}"


def write_rank(out, lib, rank, nranks, rows):
    tmp = rank_file(out, rank) + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"lib": lib, "rank": rank, "nranks": nranks, "rows": rows}, f)
    os.replace(tmp, rank_file(out, rank))


def load_rank(out, rank):
    with open(rank_file(out, rank)) as f:
        return json.load(f)


def merge(out, lib, nranks):
    """Every rank's file -> {"lib", "nranks", "transport", "rows", "wrong_by_rank"}; raises naming a missing rank."""
    parts = []
    for r in range(nranks):
        try:
            parts.append(load_rank(out, r))
        except (OSError, ValueError) as e:
            raise RuntimeError(f"{lib}: rank {r} reported no results ({e})") from None
    rows = []
    for i, row in enumerate(parts[0]["rows"]):
        m = dict(row)
        for mode in ("oop", "ip"):
            us = [p["rows"][i].get(f"{mode}_us") for p in parts]
            m[f"{mode}_us"] = None if None in us else sum(us) / nranks
            w = [p["rows"][i].get(f"{mode}_wrong") for p in parts]
            m[f"{mode}_wrong"] = None if all(x is None for x in w) else sum(x or 0 for x in w)
            notes = [f"rank {r}: {p['rows'][i][f'{mode}_note']}" for r, p in enumerate(parts)
                     if p["rows"][i].get(f"{mode}_note")]
            if notes:
                m[f"{mode}_note"] = "; ".join(notes)
        rows.append(m)
    used = sorted({r["transport"] for r in rows if r.get("transport")})
    return {"lib": lib, "nranks": nranks, "transport": "+".join(used) or lib, "rows": rows}


def wrong_total(res):
    return sum((r.get("oop_wrong") or 0) + (r.get("ip_wrong") or 0) for r in res["rows"])


def failures(results):
    """One line per (library, size, form) with wrong values, across all libraries run."""
    lines = []
    for lib, res in results.items():
        for r in (res or {}).get("rows", []):
            for mode, form in (("oop", "out-of-place"), ("ip", "in-place")):
                if r.get(f"{mode}_wrong"):
                    note = r.get(f"{mode}_note", "")
                    lines.append(f"{lib}: {r['size']} B {form}: {r[f'{mode}_wrong']} wrong values"
                                 + (f" ({note})" if note else ""))
    return lines


def exit_status(lib, rank, rows, stream):
    """Under a launcher: name this rank's wrong values on `stream`; 1 if there were any, else 0."""
    status = 0
    for line in failures({lib: {"rows": rows}}):
        print(f"harp-bench: rank {rank}: FAILED {line}", file=stream, flush=True)
        status = 1
    return status
