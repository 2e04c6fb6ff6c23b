"""Hierarchical vs flat allreduce on the arena: HARP auto / ring / rail / leader, gloo, Open MPI.

    python3 bench/vpc/hier_bench.py --shapes 2x2,4x2 --rate 1gbit --size 32M --repeat 3 \\
        --out results/arena/hier.json
    python3 bench/vpc/hier_bench.py --shapes 2x1,2x2 --sweep 8:32M:8 --repeat 2 --out results/arena/hier-sweep.json

--sweep: per size, the automatic choice against every forced HARP algorithm
(ring, recursive_doubling, halving_doubling, rail, leader), auto / best.

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
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import arena_bench  # noqa: E402  (also puts python/ on sys.path)
from harp_dev.bench import sweep  # noqa: E402
from harp_dev.cluster import net, topology as topo  # noqa: E402
import linkrate  # noqa: E402
from stamp import stamp  # noqa: E402

VARIANTS = {"harp-auto": ("harp", None), "harp-ring": ("harp", "ring"), "harp-rail": ("harp", "rail"),
            "harp-leader": ("harp", "leader"), "gloo": ("gloo", None), "mpi": ("mpi", None),
            "harp-rd": ("harp", "recursive_doubling"), "harp-hd": ("harp", "halving_doubling")}
CALIBRATION = ""  # --link-calibration: HARP_CALIBRATION_FILE for the HARP runs


def link_calibration(path, link_MBps):
    """A calibration file whose tcp line has the measured link's beta (1 / payload rate); alpha and gamma and
    the shm line stay built in (core/select/cost.cc). The built-in tcp line is loopback's (0.42 ns/byte), which
    makes a 1 Gbit/s link look 20x faster than it is and the shm legs of rail comparatively expensive."""
    with open(path, "w") as f:
        f.write(f"# hier_bench.py: tcp beta from the measured link, {link_MBps:.1f} MB/s\n"
                f"tcp 15e-6 {1 / (link_MBps * 1e6):.4g} 1.0e-10\n")
    return path


SWEEP_VARIANTS = ["harp-auto", "harp-ring", "harp-rd", "harp-hd", "harp-rail", "harp-leader"]


def modelled(algo, hosts, ppn):
    """busbw / link the bytes-per-link model allows for `algo` at hosts x ppn."""
    p = hosts * ppn
    if algo == "rail":
        return ((p - 1) / p) / ((hosts - 1) / hosts)
    if algo == "leader":  # leaders' ring over H hosts carries 2n(H-1)/H, like rail; the intra legs add shm time
        return ((p - 1) / p) / ((hosts - 1) / hosts)
    return 1.0  # flat ring, ranks of a host adjacent; gloo's and Open MPI's rings alike


def run(name, lib, algo, hosts, ppn, size, iters, out, timeout, maxbytes=None, factor=2):
    rows = run_rows(name, lib, algo, hosts, ppn, size, maxbytes or size, factor, iters, out, timeout)
    return arena_bench.time_of(rows[0]), rows[0].get("algo") or algo or ""


def run_rows(name, lib, algo, hosts, ppn, minb, maxb, factor, iters, out, timeout):
    wargs = arena_bench.worker_args(out, minb, maxb, factor, iters, 2)
    wargs["algo"] = algo
    res = arena_bench.run_lib(name, lib, hosts, wargs, timeout, ppn=ppn,
                              env={"HARP_CALIBRATION_FILE": CALIBRATION} if CALIBRATION else None)
    for row in res["rows"]:
        if (row.get("oop_wrong") or 0) + (row.get("ip_wrong") or 0):
            raise RuntimeError(f"{lib} {algo}: wrong values at {hosts}x{ppn}, {row['size']} B")
    return res["rows"]


def sweep_shape(a, hosts, ppn, tmp):
    """--sweep: every size of MIN:MAX:FACTOR for the automatic choice and each forced HARP algorithm, in one
    worker run per variant and repetition; per size: median time, the best forced variant, auto / best."""
    lo, hi, f = a.sweep.split(":")
    minb, maxb = sweep.parse_size(lo), sweep.parse_size(hi)
    times, algos = {v: {} for v in SWEEP_VARIANTS}, {}
    for rep in range(a.repeat):
        # Each repetition starts with another variant: on 2 shared cores the first job of a repetition
        # ran its small sizes up to 2x faster or slower than the same job later (a position effect).
        k = rep % len(SWEEP_VARIANTS)
        for v in SWEEP_VARIANTS[k:] + SWEEP_VARIANTS[:k]:
            lib, algo = VARIANTS[v]
            rows = run_rows(a.name, lib, algo, hosts, ppn, minb, maxb, int(f), a.sweep_iters,
                            os.path.join(tmp, f"sweep-{v}-{hosts}x{ppn}-{rep}.json"), a.timeout)
            for r in rows:
                times[v].setdefault(r["size"], []).append(arena_bench.time_of(r))
                if v == "harp-auto":
                    algos[r["size"]] = r.get("algo")
    out = {}
    print(f"## sweep {hosts} hosts x {ppn}: median us (auto's pick), best forced, auto / best")
    for size in sorted(times["harp-auto"]):
        med = {v: statistics.median(times[v][size]) for v in SWEEP_VARIANTS}
        best = min((v for v in SWEEP_VARIANTS if v != "harp-auto"), key=lambda v: med[v])
        out[size] = {"median_us": med, "auto_algo": algos.get(size), "best": best,
                     "auto_over_best": med["harp-auto"] / med[best], "runs_us": {v: times[v][size] for v in times}}
        print(f"{size:>10} " + " ".join(f"{v[5:]}={med[v]:.0f}" for v in SWEEP_VARIANTS) +
              f"  auto={algos.get(size)} best={best[5:]} auto/best={med['harp-auto'] / med[best]:.3f}", flush=True)
    return out


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
    ap.add_argument("--sweep", default="", help="MIN:MAX:FACTOR, e.g. 8:32M:8: the automatic choice against every "
                                                 "forced HARP algorithm per size instead of the 32 MB comparison")
    ap.add_argument("--sweep-iters", type=int, default=10)
    ap.add_argument("--link-calibration", action="store_true",
                    help="HARP runs get HARP_CALIBRATION_FILE with tcp's beta from the measured link rate")
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
        if a.link_calibration:
            global CALIBRATION
            CALIBRATION = link_calibration(os.path.join(tmp, "calibration.txt"), link)
            record["calibration"] = open(CALIBRATION).read()
            print("# " + record["calibration"].replace("\n", "\n# "), flush=True)
        for hosts, ppn in shapes:
            if a.sweep:
                record.setdefault("sweep", {})[f"{hosts}x{ppn}"] = sweep_shape(a, hosts, ppn, tmp)
                continue
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
