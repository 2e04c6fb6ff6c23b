"""Hierarchical vs flat allreduce on the arena (issue 16): HARP auto / ring / rail / leader, gloo, Open MPI.

    python3 bench/vpc/hier_bench.py --shapes 2x2,4x2 --rate 1gbit --size 32M --repeat 3 \\
        --out bench/vpc/results/hier.json

Brings up (or reuses) arena cluster --name (default hier) with the most hosts
of --shapes, measures the link payload rate (single TCP stream, linkrate.py,
3 times), then for every shape HxL (H hosts, L ranks per host) and repetition
runs the harp-bench worker with L ranks per host: HARP with the automatic
choice and with algo= ring (flat), rail and leader forced, gloo (torch) and Open
MPI (mpi4py, TCP BTL), all in the same run, one after the other. Reuses
bench/vpc/arena_bench.py's worker arguments, result merging and summary.

The bytes-per-link model (one NIC per host, each direction, n bytes per rank):
the flat ring with each host's ranks adjacent carries 2n(p-1)/p over a host's
link, the same as one rank alone, so its busbw (2n(p-1)/p / t) can reach the
link rate; rail carries 2n(H-1)/H, so its busbw can reach
((p-1)/p) / ((H-1)/H) x the link: 1.5 at 2x2, 1.17 at 4x2. Reported: busbw,
busbw / link, and measured / modelled for the flat ring and for rail (the
automatic choice is compared with the model of the algorithm it ran).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import arena_bench  # noqa: E402  (also puts python/ on sys.path)
from harp.bench import check, sweep  # noqa: E402
from harp.cluster import net, topology as topo  # noqa: E402
import linkrate  # noqa: E402
from stamp import stamp  # noqa: E402

VARIANTS = {"harp-auto": ("harp", None), "harp-ring": ("harp", "ring"), "harp-rail": ("harp", "rail"),
            "harp-leader": ("harp", "leader"), "gloo": ("gloo", None), "mpi": ("mpi", None)}


def modelled(algo, hosts, ppn):
    """busbw / link the bytes-per-link model allows for `algo` at hosts x ppn."""
    p = hosts * ppn
    if algo == "rail":
        return ((p - 1) / p) / ((hosts - 1) / hosts)
    if algo == "leader":  # leaders' ring over H hosts carries 2n(H-1)/H, like rail; the intra legs add shm time
        return ((p - 1) / p) / ((hosts - 1) / hosts)
    return 1.0  # flat ring, ranks of a host adjacent; gloo's and Open MPI's rings alike


def run(name, lib, algo, hosts, ppn, size, iters, out, timeout):
    wargs = arena_bench.worker_args(out, size, size, 2, iters, 1)
    wargs["algo"] = algo
    env = dict(os.environ, PYTHONPATH=os.path.abspath(arena_bench.PYDIR), GLOO_SOCKET_IFNAME="eth0",
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "harp.cluster", "run", "--name", name, "--hosts", str(hosts), "--ppn", str(ppn),
           "--launcher", arena_bench.LIBS[lib], "--timeout", str(timeout), "--", sys.executable, "-m",
           "harp.bench.workers", lib, json.dumps(wargs)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
    if r.returncode:
        raise RuntimeError(f"{lib} {algo} on {hosts}x{ppn} failed ({r.returncode}): {r.stderr[-2000:]}")
    res = check.merge(out, lib, hosts * ppn)
    row = res["rows"][0]
    if (row.get("oop_wrong") or 0) + (row.get("ip_wrong") or 0):
        raise RuntimeError(f"{lib} {algo}: wrong values at {hosts}x{ppn}")
    return arena_bench.time_of(row), row.get("algo") or algo or ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="hier")
    ap.add_argument("--shapes", default="2x2,4x2")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--size", default="32M")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    size = sweep.parse_size(a.size)
    variants = a.variants.split(",")
    st = topo.load(a.name)
    made = st is None
    if made:
        st = net.up(a.name, max(h for h, _ in shapes), rate=a.rate)
    try:
        record = {"stamp_before": stamp(), "command": " ".join(sys.argv), "size": size,
                  "cluster": {k: st[k] for k in ("hosts", "rate", "mtu", "congestion")},
                  "link_MBps": [linkrate.measure(st, 1, 0) for _ in range(3)], "by_shape": {}}
        link = statistics.median(record["link_MBps"])
        print(f"# link payload rate (single TCP stream): {record['link_MBps']} MB/s, median {link:.1f}", flush=True)
        tmp = tempfile.mkdtemp(prefix="hier-bench-")
        for hosts, ppn in shapes:
            runs = {v: [] for v in variants}
            algos = {}
            for rep in range(a.repeat):
                for v in variants:
                    lib, algo = VARIANTS[v]
                    us, ran = run(a.name, lib, algo, hosts, ppn, size, a.iters,
                                  os.path.join(tmp, f"{v}-{hosts}x{ppn}-{rep}.json"), a.timeout)
                    runs[v].append(us)
                    algos[v] = ran
                    print(f"# {hosts}x{ppn} rep {rep} {v} ({ran}): {us / 1e3:.1f} ms", flush=True)
            record["by_shape"][f"{hosts}x{ppn}"] = summary = summarise(runs, algos, hosts, ppn, size, link)
            print_summary(hosts, ppn, summary, link, size)
        record["stamp_after"] = stamp()
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)
    finally:
        if made:
            net.down(st)


def summarise(runs, algos, hosts, ppn, size, link):
    out = {}
    factor = sweep.bus_factor("allreduce", hosts * ppn)
    ring = statistics.median(runs["harp-ring"]) if runs.get("harp-ring") else None
    for v, ts in runs.items():
        med = statistics.median(ts)
        bw = size / (med * 1e-6) / 1e6 * factor
        algo = algos.get(v) or ""
        model = modelled("rail" if "rail" in algo else "leader" if "leader" in algo else "ring", hosts, ppn)
        out[v] = {"algo": algo, "us": ts, "us_median": med, "us_min": min(ts), "us_max": max(ts),
                  "busbw_MBps": bw, "busbw_over_link": bw / link, "modelled_over_link": model,
                  "measured_over_modelled": bw / link / model, "speedup_over_harp_ring": ring / med if ring else None}
    return out


def print_summary(hosts, ppn, summ, link, size):
    print(f"## allreduce {size} B float32, {hosts} hosts x {ppn} ranks, link {link:.1f} MB/s")
    print(f"{'variant':>12} {'algo':>10} {'median ms':>10} {'min..max ms':>16} {'busbw MB/s':>11} {'/link':>6} "
          f"{'model':>6} {'meas/model':>10} {'x ring':>7}")
    for v, r in summ.items():
        sp = f"{r['speedup_over_harp_ring']:.2f}" if r["speedup_over_harp_ring"] else ""
        print(f"{v:>12} {r['algo'][:10]:>10} {r['us_median'] / 1e3:10.1f} {r['us_min'] / 1e3:7.1f}..{r['us_max'] / 1e3:<8.1f}"
              f" {r['busbw_MBps']:11.2f} {r['busbw_over_link']:6.3f} {r['modelled_over_link']:6.2f} "
              f"{r['measured_over_modelled']:10.3f} {sp:>7}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
