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


# Values compared per step: the check regenerates every rank's input slice by slice (sweep.fill_values)
# so its memory stays a few MB whatever the message size and rank count (holding every rank's input as
# float64 made a 16-rank 32 MB run need 2.3 GB per rank).
CHUNK = 1 << 18


def _segments(coll, nranks, rank, count_send, count_recv, root):
    """Where one call's output on `rank` comes from: (output offset, length, source rank or None for
    "the reduction over every rank", offset in the source input). [] where the rank has no defined
    output (reduce on a non-root)."""
    if coll in ("allreduce", "reduce"):
        return [] if coll == "reduce" and rank != root else [(0, count_send, None, 0)]
    if coll == "reduce_scatter":
        return [(0, count_recv, None, rank * count_recv)]
    if coll == "broadcast":
        return [(0, count_send, root, 0)]
    if coll == "allgather":
        return [(q * count_send, count_send, q, 0) for q in range(nranks)]
    if coll == "alltoall":
        per = count_send // nranks
        return [(q * per, per, q, rank * per) for q in range(nranks)]
    raise ValueError(f"harp-bench: no expected value for collective '{coll}'")


def _expected_slice(src, lo, n, nranks, dtype, op):
    """float64 expected values of input elements lo..lo+n-1 of rank `src`, or of their reduction."""
    def inp(r):
        return sweep.fill_values(lo, lo + n, r, dtype).astype(np.float64)
    if src is not None:
        return inp(src)
    acc = inp(0)
    for r in range(1, nranks):
        x = inp(r)
        if op in ("sum", "avg"):
            acc += x
        elif op == "prod":
            acc *= x
        elif op == "min":
            np.minimum(acc, x, out=acc)
        elif op == "max":
            np.maximum(acc, x, out=acc)
        else:
            raise ValueError(f"harp-bench: unknown op '{op}'")
    if op == "avg":
        acc /= nranks
        if np.issubdtype(dtype, np.integer):
            np.trunc(acc, out=acc)
    return acc


def _chunks(segments, nranks, dtype, op):
    """(output offset, float64 expected values) of `segments` (_segments) in pieces of at most CHUNK values."""
    for out_off, length, src, src_off in segments:
        for i in range(0, length, CHUNK):
            n = min(CHUNK, length - i)
            yield out_off + i, _expected_slice(src, src_off + i, n, nranks, dtype, op)


def expected(coll, nranks, rank, dtype, count_send, count_recv, op, root):
    """Expected output of one call on `rank`, from the fill() inputs of every rank (float64);
    None where the rank has no defined output (reduce on a non-root). Whole-array form of
    count_wrong's check, for small sizes and tests."""
    segments = _segments(coll, nranks, rank, count_send, count_recv, root)
    if not segments:
        return None
    parts = [p for _, p in _chunks(segments, nranks, dtype, op)]
    return np.concatenate(parts) if parts else np.zeros(0)


def count_wrong(out, coll, nranks, rank, dtype, count_send, count_recv, op, root):
    """(number of wrong values, "first wrong: [i] = got, expected exp" or "") for one call's output on
    `rank`, compared chunk by chunk against the expected values (see expected())."""
    segments = _segments(coll, nranks, rank, count_send, count_recv, root)
    if not segments:
        return 0, ""
    flat = np.asarray(out).reshape(-1)
    need = sum(length for _, length, _, _ in segments)
    if flat.size < need:
        return need, f"output has {flat.size} values, expected {need}"
    rtol = 1e-2 if np.dtype(dtype).itemsize <= 2 else 1e-5
    n, first = 0, ""
    for off, exp in _chunks(segments, nranks, dtype, op):
        got = flat[off:off + exp.size].astype(np.float64)
        bad = ~np.isclose(got, exp, rtol=rtol)
        k = int(np.count_nonzero(bad))
        if k and not first:
            i = int(np.flatnonzero(bad)[0])
            first = f"first wrong: [{off + i}] = {float(got[i]):g}, expected {float(exp[i]):g}"
        n += k
    return n, first


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
