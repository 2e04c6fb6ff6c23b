#!/usr/bin/env python3
"""Memory soak: random collectives of every kind for a while, RSS sampled.

    python bench/soak.py --minutes 10 --ranks 3 --transport tcp --out soak.json

N local ranks (forked, loopback only) run the same random sequence (one seed):
every collective (allreduce with a random registered algorithm, broadcast,
reduce, allgather, reduce_scatter, alltoall, alltoallv, gather, scatter,
barrier, send/recv ring, allreduce_coalesced), every dtype and op, sizes
log-uniform in 0 B..--max-bytes, each result checked against numpy
(tests/collectives_check.py's reference). Every --sample seconds a rank calls
malloc_trim(0) and reads its RSS (/proc/self/statm) and glibc's mallinfo2.

The JSON written to --out holds the run's stamp (commit, CPU, cores, load,
start/end time, arguments), per rank the op count, wrong results, errors and
the samples, and a summary: RSS at the end of each third of the run (median of
the samples in that third) and the growth from the middle to the last third.
Exit status 1 when a result was wrong or a rank failed.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import harp  # noqa: E402
from collectives_check import DTYPES, data, ops_for, reference, same  # noqa: E402
from harness import collect, start_ranks  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def rss_sample():
    """(RSS MiB after malloc_trim, glibc heap figures in MiB)."""
    _libc.malloc_trim(0)
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    mi = _libc.mallinfo2()
    mib = 1 << 20
    return rss / mib, {"arena": mi.arena / mib, "mmap": mi.hblkhd / mib, "in_use": mi.uordblks / mib,
                       "free": mi.fordblks / mib, **{f"rss_{k}": v / mib for k, v in smaps_rss().items()}}


def smaps_rss():
    """Resident bytes by kind of mapping (/proc/self/smaps): heap (brk), anon (mmap: large malloc
    blocks, thread arenas, pymalloc, the core's scratch), shm (memfd and /dev/shm), file (code)."""
    out = {"heap": 0, "anon": 0, "shm": 0, "file": 0}
    kind = "anon"
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 6)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                name = head[5].strip() if len(head) > 5 else ""
                kind = ("heap" if name == "[heap]" else "shm" if ("memfd:" in name or name.startswith("/dev/shm"))
                        else "file" if name.startswith("/") else "anon")
            elif head[0] == "Rss:":
                out[kind] += int(head[1]) * 1024
    return out


def _pick_size(rng, max_bytes, itemsize):
    if rng.random() < 0.05:
        return 0
    b = int(math.exp(rng.uniform(0, math.log(max_bytes))))
    return max(1, b // itemsize)


KINDS = ["allreduce", "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "alltoallv",
         "gather", "scatter", "barrier", "sendrecv", "coalesced"]


def one_op(c, rng, max_bytes, algos, kinds=KINDS):
    """Run one random collective (of `kinds`); returns (name, ok)."""
    p, r = c.size, c.rank
    kind = rng.choice(kinds)
    dt = DTYPES[rng.integers(len(DTYPES))]
    op = rng.choice(ops_for(dt))
    salt = int(rng.integers(1 << 20))
    n = _pick_size(rng, max_bytes, dt.itemsize)
    root = int(rng.integers(p))
    name = f"{kind} {dt} {op} n={n}"
    if kind == "allreduce":
        algo = algos[rng.integers(len(algos))] if rng.random() < 0.5 else None
        inputs = [data(q, n, dt, salt) for q in range(p)]
        out = np.empty_like(inputs[r])
        c.allreduce(inputs[r], out, op, algo=algo)
        return f"{name} {algo}", same(out, reference(inputs, dt, op, p), dt, p)
    if kind == "broadcast":
        x = data(r, n, dt, salt) if r == root else np.zeros(n, dt)
        c.broadcast(x, root)
        return name, same(x, data(root, n, dt, salt), dt)
    if kind == "reduce":
        inputs = [data(q, n, dt, salt) for q in range(p)]
        out = np.zeros(n, dt)
        c.reduce(inputs[r], out, op, root)
        return name, r != root or same(out, reference(inputs, dt, op, p), dt, p)
    n = max(n // p, 0)
    if kind == "allgather":
        got = c.allgather(data(r, n, dt, salt))
        return name, same(got, np.stack([data(q, n, dt, salt) for q in range(p)]), dt)
    if kind == "reduce_scatter":
        inputs = [data(q, n * p, dt, salt) for q in range(p)]
        got = c.reduce_scatter(inputs[r], None, op)
        return name, same(got, reference(inputs, dt, op, p)[r * n:(r + 1) * n], dt, p)
    if kind == "alltoall":
        got = c.alltoall(data(r, n * p, dt, salt))
        exp = np.concatenate([data(q, n * p, dt, salt)[r * n:(r + 1) * n] for q in range(p)])
        return name, same(got, exp, dt)
    if kind == "alltoallv":
        cnt = lambda s, d: (n * (s + 2 * d + salt) // (2 * p)) % (n + 1)  # noqa: E731 - uneven counts
        sc = [cnt(r, q) for q in range(p)]
        rc = [cnt(q, r) for q in range(p)]
        send = data(r, sum(sc), dt, salt)
        recv = np.zeros(sum(rc), dt)
        c.alltoallv(send, sc, recv, rc)
        parts = []
        for q in range(p):
            sq = [cnt(q, d) for d in range(p)]
            parts.append(data(q, sum(sq), dt, salt)[sum(sq[:r]):sum(sq[:r]) + sq[r]])
        return name, same(recv, np.concatenate(parts) if parts else recv, dt)
    if kind == "gather":
        got = c.gather(data(r, n, dt, salt), None, root)
        return name, r != root or same(got, np.stack([data(q, n, dt, salt) for q in range(p)]), dt)
    if kind == "scatter":
        full = data(root, n * p, dt, salt)
        out = np.zeros(n, dt)
        c.scatter(full if r == root else None, out, root)
        return name, same(out, full[r * n:(r + 1) * n], dt)
    if kind == "barrier":
        c.barrier()
        return "barrier", True
    if kind == "sendrecv":
        x = data(r, n, dt, salt)
        out = np.zeros(n, dt)
        for step in range(2):  # even ranks send first, odd ones receive first (no reliance on buffering)
            if (r % 2 == 0) == (step == 0):
                c.send(x, (r + 1) % p, tag=salt)
            else:
                c.recv(out, (r - 1) % p, tag=salt)
        return name, same(out, data((r - 1) % p, n, dt, salt), dt)
    # allreduce_coalesced: 1-16 arrays, mixed dtypes, sizes summing to about n elements
    k = int(rng.integers(1, 17))
    dts = [DTYPES[rng.integers(len(DTYPES))] for _ in range(k)]
    sizes = [int(rng.integers(0, max(n // k, 1) + 1)) for _ in range(k)]
    cop = rng.choice(["sum", "max", "min"])
    inputs = [[data(q, m, d, salt + i) for i, (m, d) in enumerate(zip(sizes, dts))] for q in range(p)]
    mine = [x.copy() for x in inputs[r]]
    c.allreduce_coalesced(mine, cop)
    ok = all(same(mine[i], reference([inputs[q][i] for q in range(p)], dts[i], cop, p), dts[i], p)
             for i in range(k))
    return f"coalesced k={k} {cop} n={sum(sizes)}", ok


def rank_main(rank, size, seconds, max_bytes, seed, sample_s):
    c = harp.init()
    algos = [a.strip() for a in harp._harp.algorithms("allreduce").split(",") if a.strip()]
    rng = np.random.default_rng(seed)  # same sequence on every rank
    t0 = time.monotonic()
    samples, wrong, errors, ops = [], [], [], 0
    next_sample = 0.0
    stop = np.zeros(1, np.int32)
    while True:
        if ops % 8 == 0:  # agree on stopping (rank 0's clock)
            stop[0] = int(rank == 0 and time.monotonic() - t0 >= seconds)
            c.broadcast(stop, 0)
            if stop[0]:
                break
        try:
            what, ok = one_op(c, rng, max_bytes, algos)
            if not ok:
                wrong.append(what)
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(f"{type(e).__name__}: {e}"[:300])
            if c.broken:
                break
        ops += 1
        t = time.monotonic() - t0
        if t >= next_sample:
            rss, heap = rss_sample()
            samples.append({"t": round(t, 1), "ops": ops, "rss_mib": round(rss, 2),
                            **{k: round(v, 2) for k, v in heap.items()}})
            next_sample = t + sample_s
    rss, heap = rss_sample()
    samples.append({"t": round(time.monotonic() - t0, 1), "ops": ops, "rss_mib": round(rss, 2),
                    **{k: round(v, 2) for k, v in heap.items()}})
    c.destroy()
    return {"rank": rank, "ops": ops, "wrong": wrong[:20], "n_wrong": len(wrong), "errors": errors[:20],
            "n_errors": len(errors), "samples": samples}


def thirds(samples, seconds):
    """Median RSS of the samples in each third of the run."""
    out = []
    for k in range(3):
        lo, hi = seconds * k / 3, seconds * (k + 1) / 3
        v = [s["rss_mib"] for s in samples if lo <= s["t"] < hi] or [samples[-1]["rss_mib"]]
        out.append(round(statistics.median(v), 2))
    return out


def summarize(ranks, seconds, settle=600.0):
    """Per rank: ops, wrong, errors, RSS per third, growth middle -> last third, and the drift after
    `settle` seconds (the highest RSS after it minus the RSS sampled nearest to it)."""
    summary = []
    for rk in ranks:
        if "samples" not in rk:
            summary.append({"rank": rk["rank"], "failed": True})
            continue
        ss = rk["samples"]
        th = thirds(ss, seconds)
        rs = [s["rss_mib"] for s in ss]
        row = {"rank": rk["rank"], "ops": rk["ops"], "wrong": rk["n_wrong"], "errors": rk["n_errors"],
               "rss_thirds_mib": th, "growth_mid_to_last_mib": round(th[2] - th[1], 2),
               "rss_min_mib": min(rs), "rss_max_mib": max(rs), "rss_end_mib": rs[-1]}
        if ss[-1]["t"] > settle:
            at = min(ss, key=lambda s: abs(s["t"] - settle))
            after = max(s["rss_mib"] for s in ss if s["t"] >= at["t"])
            row.update({f"rss_at_{settle:g}s_mib": at["rss_mib"], f"max_after_{settle:g}s_mib": after,
                        f"drift_after_{settle:g}s_mib": round(after - at["rss_mib"], 2)})
        summary.append(row)
    return summary


def stamp():
    def sh(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=10).stdout.strip()
        except OSError:
            return ""
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"commit": sh("git", "rev-parse", "HEAD"), "dirty": bool(sh("git", "status", "--porcelain", "-uno")),
            "harp": os.path.dirname(harp.__file__), "cpu": cpu, "cores": os.cpu_count(), "host": platform.node(), "loadavg_start": os.getloadavg(),
            "start_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def parse_bytes(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * m[s[-1].upper()]) if s[-1].upper() in m else int(s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--max-bytes", default="8M")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--out", default="")
    ap.add_argument("--report", default="", help="print the summary of an earlier run's JSON (no run)")
    ap.add_argument("--settle", type=float, default=600.0, help="seconds after which RSS should stay flat")
    a = ap.parse_args(argv)
    if a.report:
        with open(a.report) as f:
            doc = json.load(f)
        secs = doc["meta"]["args"]["minutes"] * 60
        print(json.dumps({"meta": doc["meta"], "summary": summarize(doc["ranks"], secs, a.settle)}, indent=1))
        return 0
    seconds = a.minutes * 60
    meta = {**stamp(), "args": vars(a)}
    env = {"HARP_TRANSPORT": a.transport} if a.transport else {}
    if "HARP_DEBUG" not in os.environ:  # not a line per hierarchical algorithm's fallback
        env["HARP_DEBUG"] = "NONE"
    procs, q = start_ranks(a.ranks, rank_main, seconds, parse_bytes(a.max_bytes), a.seed, a.sample, env=env)
    res = collect(procs, q, timeout=seconds + 600, allow_errors=True)
    ranks = []
    for r, (status, val) in enumerate(res):
        ranks.append(val if status == "ok" else {"rank": r, "failed": str(val)[:2000]})
    summary = summarize(ranks, seconds, a.settle)
    meta.update(end_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), loadavg_end=os.getloadavg())
    doc = {"meta": meta, "summary": summary, "ranks": ranks}
    text = json.dumps(doc, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(json.dumps({"meta": meta, "summary": summary}, indent=1))
    bad = any(s.get("failed") or s.get("wrong") or s.get("errors") for s in summary)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
