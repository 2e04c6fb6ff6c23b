"""Small allgather, reduce-scatter and alltoall across hosts at a round-trip time: HARP's own choice
against its ring (pairwise for alltoall) and every log-step algorithm, forced; gloo and Open MPI
beside; each measured time against the cost model's prediction for the algorithm that ran.

    python3 bench/vpc/logstep_bench.py --hosts 8 --delay 500us --repeat 2 \\
        --out results/arena/logstep-rtt1ms.json
    python3 bench/vpc/logstep_bench.py --name algos --hosts 8 --ppn 2 --delay 500us --repeat 2 \\
        --out results/arena/logstep-8x2-rtt1ms.json
    python3 bench/vpc/logstep_bench.py --name algos --hosts 4 --ppn 2 --delay 0 --sizes 256K:4M:4 \\
        --colls allgather,reduce_scatter --algos ring,leader --out results/arena/hier-agrs-4x2-large-rtt0.json

--ppn N puts N ranks on each host (HARP's ranks on one host talk over shm, the tuner sees the
hosts: the hierarchical `leader` is then forced too, and the model is harp-config --explain's with
--hosts/--ppn and the mixed transport). --sizes MIN:MAX:FACTOR (default 8:64K:2) sweeps other sizes;
--algos limits the forced HARP algorithms (the ring always runs). Each repetition runs the variants
in another order (the second reversed: ABBA), so a drift in the shared machine's load falls on all.
--interleave TURNS runs HARP's variants (auto, the ring, every forced algorithm) and gloo in the same
rank processes instead, taking turns in an order rotated every turn (harp_dev.bench.interleave):
per size and variant, each turn's time is the slowest rank's mean over a batch of calls, the figure
the median turn. Open MPI (its own launcher) still runs as a job of its own beside them.

One arena (--hosts hosts x one rank, --rate, harp-cluster --delay: 500us one way = 1 ms RTT) comes
up; scripts/calibrate.py --cluster measures the tcp line (alpha = half the round trip, beta) and its
file is HARP_CALIBRATION_FILE for every HARP run, as a user who calibrated would have it. Per
repetition and collective the harp-bench worker sweeps 8 B-64 KB (nccl-tests sizes: the largest
buffer) once with HARP's choice ("auto"), once per forced algorithm, then gloo and MPI; every
result is checked by the worker. Per size: the slowest rank's time (median over repetitions), the
algorithm auto ran, the model's time for it (harp-config --explain with the same calibration:
the tuner's own view of the call), measured / model (the goal: <= 1.1), ring / auto (goal at 8 B:
>= 3) and HARP / gloo, HARP / MPI. One JSON, stamped.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import arena_bench  # noqa: E402  (run_lib, worker_args, time_of; puts python/ on the path)
from harp_dev.bench import check, sweep  # noqa: E402
from harp_dev.cluster import net  # noqa: E402
import linkrate  # noqa: E402
from stamp import stamp, write_record  # noqa: E402
from tuner_bench import calibrate  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# collective -> (its ring-like baseline, the log-step algorithms)
COLLS = {
    "allgather": ("ring", ["bruck", "recursive_doubling", "pat"]),
    "reduce_scatter": ("ring", ["recursive_halving", "bruck", "pat"]),
    "alltoall": ("pairwise", ["bruck"]),
}
HIER = {"allgather": ["leader"], "reduce_scatter": ["leader"]}  # forced too with --ppn > 1


def algos_of(coll, ppn, only=""):
    """(ring-like baseline, the other forced HARP algorithms) for `coll` at `ppn` ranks per host."""
    ring, logs = COLLS[coll]
    logs = logs + (HIER.get(coll, []) if ppn > 1 else [])
    if only:
        logs = [x for x in logs if x in only.split(",")]
    return ring, logs
UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def predictions(calib, coll, hosts, size, ppn=1):
    """{algorithm: predicted seconds} and the pick, from harp-config --explain (the count the
    worker's describe() gives the tuner; with ppn > 1 the hosts' shape and the mixed transport)."""
    p = hosts * ppn
    count = sweep.counts(coll, size, 4, p)[2]
    if coll == "alltoall":
        count //= p  # HARP's alltoall count is one block
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), HARP_CALIBRATION_FILE=calib)
    shape = ["--transport", "tcp", "--ranks", str(p)] if ppn == 1 else \
        ["--transport", "mixed", "--hosts", str(hosts), "--ppn", str(ppn)]
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", "--explain", coll, str(count * 4)] + shape,
                       capture_output=True, text=True, env=env, timeout=60)
    pred = {}
    for m in re.finditer(r"^\s+(\w+)\s+.*?\s([\d.]+) (ns|us|ms|s)\s+(ok|failed)", r.stdout, re.M):
        pred[m.group(1)] = float(m.group(2)) * UNITS[m.group(3)]
    pick = re.search(r"^pick: (\w+)", r.stdout, re.M)
    if not pick:
        raise RuntimeError(f"harp-config --explain {coll}: no pick: {r.stdout[-800:]} {r.stderr[-800:]}")
    return pred, pick.group(1)


def make_rows(runs, variants, ring, peers, calib, coll, hosts, ppn=1):
    rows = []
    for s in sorted(runs["auto"][0], key=int):
        med = {k: statistics.median(r[s]["us"] for r in runs[k]) for k in variants}
        pred, ran = predictions(calib, coll, hosts, int(s), ppn)  # the tuner's pick for this call, as auto ran it
        model = pred.get(ran)
        row = {"size": int(s), "ran": ran, "described": runs["auto"][0][s]["algo"], "us": med,
               "spread_us": {k: (min(r[s]["us"] for r in runs[k]), max(r[s]["us"] for r in runs[k]))
                             for k in variants},
               "model_us": model * 1e6 if model else None, "predicted_us": {k: v * 1e6 for k, v in pred.items()},
               "auto_over_model": med["auto"] / (model * 1e6) if model else None,
               "ring_over_auto": med[ring] / med["auto"]}
        for peer in peers:
            row[f"harp_over_{peer}"] = med["auto"] / med[peer]
        row["model_over_ring_model"] = (pred.get(ring) / model) if model and pred.get(ring) else None
        rows.append(row)
    return rows


def print_rows(coll, rows, ring, logs, peers, a):
    print(f"## {coll}, {a.hosts} hosts x {getattr(a, 'ppn', 1)} ranks, {a.rate}, one-way delay {a.delay}")
    print(f"{'bytes':>7} {'ran':>18} {'auto us':>9} {'model us':>9} {'/model':>7} {ring + ' us':>12}"
          f" {'ring/auto':>9}" + "".join(f" {k[:12] + ' us':>15}" for k in logs + peers))
    for r in rows:
        print(f"{r['size']:>7} {r['ran']:>18} {r['us']['auto']:9.0f} {r['model_us'] or float('nan'):9.0f}"
              f" {r['auto_over_model'] or float('nan'):7.2f} {r['us'][ring]:12.0f} {r['ring_over_auto']:9.2f}"
              + "".join(f" {r['us'][k]:15.0f}" for k in logs + peers), flush=True)


def recompute(a):
    """--recompute: the rows of a recorded run again (the model from its own calibration)."""
    import json
    with open(a.out) as f:
        record = json.load(f)
    calib = os.path.join(tempfile.mkdtemp(prefix="logstep-bench-"), "calib.txt")
    with open(calib, "w") as f:
        f.write(record["calibration"]["file"])
    peers = [x for x in a.libs.split(",") if x]
    ppn = record.get("ppn", 1)
    for coll, rec in record["by_coll"].items():
        ring = COLLS[coll][0]
        logs = [k for k in rec["runs"] if k not in ["auto", ring] + peers]
        variants = ["auto", ring] + logs + peers
        rec["rows"] = make_rows(rec["runs"], variants, ring, peers, calib, coll, record["cluster"]["hosts"], ppn)
        a.hosts, a.delay, a.ppn = record["cluster"]["hosts"], record["cluster"].get("delay_ns"), ppn
        print_rows(coll, rec["rows"], ring, logs, peers, a)
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)


def run_one(name, spec, hosts, tmp, tag, coll, algo, iters, timeout, ppn=1, sizes=(8, 64 << 10, 2), warmup=5):
    wa = arena_bench.worker_args(os.path.join(tmp, f"{tag}.json"), sizes[0], sizes[1], sizes[2], iters, warmup)
    wa.update(coll=coll, algo=algo)
    res = arena_bench.run_lib(name, spec, hosts, wa, timeout, ppn=ppn)
    wrong = sum((r.get("oop_wrong") or 0) + (r.get("ip_wrong") or 0) for r in res["rows"])
    if wrong:
        raise RuntimeError(f"{tag}: {wrong} wrong values")
    return {r["size"]: {"us": arena_bench.time_of(r), "algo": r.get("algo")} for r in res["rows"]}


def run_interleaved(name, spec, hosts, ppn, tmp, tag, coll, variants, turns, batch, sizes, timeout):
    """HARP's variants (and gloo) in one job, taking turns: {variant: {size: {"us", "turns_us", "algo"}}}."""
    lib, extra = arena_bench.split_lib(spec)
    libs = [v if v == "gloo" else "harp" if v == "auto" else f"harp:{v}" for v in variants]
    out = os.path.join(tmp, f"{tag}.json")
    wa = arena_bench.worker_args(out, sizes[0], sizes[1], sizes[2], 0, 3)
    wa.update(coll=coll, libs=libs, reps=turns, call_by_call=False, rounds=1, max_iters=batch, iters=batch)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(arena_bench.PYDIR), GLOO_SOCKET_IFNAME="eth0",
               OMP_NUM_THREADS="1", **extra)
    cmd = [sys.executable, "-m", "harp_dev.cluster", "run", "--name", name, "--hosts", str(hosts), "--ppn", str(ppn),
           "--launcher", "harp", "--timeout", str(timeout), "--", sys.executable, "-m", "harp_dev.bench.interleave",
           "interleave", json.dumps(wa)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
    if r.returncode:
        raise RuntimeError(f"interleaved {coll} on {hosts}x{ppn} failed ({r.returncode}): {r.stderr[-2000:]}")
    parts = [check.load_rank(out, q)["rows"] for q in range(hosts * ppn)]
    res = {v: {} for v in variants}
    for i, row in enumerate(parts[0]):
        for v, lname in zip(variants, libs):
            wrong = sum((p[i]["libs"][lname].get(f"{m}_wrong") or 0) for p in parts for m in ("oop", "ip"))
            if wrong:
                raise RuntimeError(f"interleaved {coll} {v}: {wrong} wrong values at {row['size']} B")
            per_turn = [max(p[i]["libs"][lname]["samples"][t] for p in parts) for t in range(turns)]
            res[v][row["size"]] = {"us": statistics.median(per_turn), "turns_us": per_turn,
                                        "algo": row["libs"][lname].get("algo")}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="logstep")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--ppn", type=int, default=1, help="ranks per host")
    ap.add_argument("--sizes", default="8:64K:2", help="MIN:MAX:FACTOR bytes (the largest buffer)")
    ap.add_argument("--algos", default="", help="only these forced HARP algorithms (besides the ring)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--interleave", type=int, default=0, metavar="TURNS",
                    help="HARP's variants and gloo in the same ranks, TURNS turns of --iters calls each")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay", default="500us", help="one-way delay (harp-cluster --delay); 0 for none")
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--libs", default="gloo,mpi", help="peers run beside HARP ('' for none)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", required=True)
    ap.add_argument("--recompute", action="store_true", help="only redo the rows of the run recorded in --out")
    a = ap.parse_args()
    if a.recompute:
        return recompute(a)
    peers = [x for x in a.libs.split(",") if x]
    colls = [c for c in a.colls.split(",") if c]
    tmp = tempfile.mkdtemp(prefix="logstep-bench-")
    lo, hi, fac = a.sizes.split(":")
    sizes = (sweep.parse_size(lo), sweep.parse_size(hi), int(fac))
    record = {"stamp_before": stamp(), "command": " ".join(sys.argv), "by_coll": {}, "ppn": a.ppn,
              "load_before": os.getloadavg()}
    st = net.up(a.name, a.hosts, rate=a.rate, delay=None if a.delay in ("0", "") else a.delay)
    try:
        calib = os.path.join(tmp, "calib.txt")
        cal = calibrate(a.name, calib)
        link = statistics.median(linkrate.measure(st, 1, 0) for _ in range(3))
        record["cluster"] = {k: st.get(k) for k in ("hosts", "rate", "mtu", "delay_ns", "delay_line_ns",
                                                     "rtt_asked_us", "rtt_measured_us")}
        record.update(link_MBps=link, calibration=cal)
        print(f"# {a.hosts} hosts, delay {a.delay}: RTT measured {(st.get('rtt_measured_us') or {}).get('median')}"
              f" us; calibrated alpha {cal['alpha_s'] * 1e6:.0f} us, beta {cal['beta_s_per_byte'] * 1e9:.2f} ns/B;"
              f" link {link:.1f} MB/s", flush=True)
        harp_spec = "harp@HARP_CALIBRATION_FILE=" + calib
        for coll in colls:
            ring, logs = algos_of(coll, a.ppn, a.algos)
            variants = ["auto", ring] + logs + peers
            runs = {k: [] for k in variants}
            loads = []
            if a.interleave:
                inter = [k for k in variants if k != "mpi"]
                got = run_interleaved(a.name, harp_spec, a.hosts, a.ppn, tmp, f"{coll}-inter", coll, inter,
                                      a.interleave, a.iters, sizes, a.timeout)
                for k in inter:
                    runs[k].append(got[k])
                if "mpi" in variants:
                    runs["mpi"].append(run_one(a.name, "mpi", a.hosts, tmp, f"{coll}-mpi", coll, None, a.iters,
                                               a.timeout, a.ppn, sizes, a.warmup))
                loads.append(os.getloadavg()[0])
                for k in variants:
                    print(f"# {coll} {k} (load {loads[-1]:.1f}): " + ", ".join(
                        f"{s}B {v['us']:.0f}us" for s, v in sorted(runs[k][-1].items(), key=lambda x: int(x[0]))),
                        flush=True)
            for rep in range(0 if a.interleave else a.repeat):
                for k in (variants if rep % 2 == 0 else variants[::-1]):  # ABBA over repetitions
                    spec = k if k in peers else harp_spec
                    algo = None if k == "auto" or k in peers else k
                    runs[k].append(run_one(a.name, spec, a.hosts, tmp, f"{coll}-{rep}-{k}", coll, algo, a.iters,
                                           a.timeout, a.ppn, sizes, a.warmup))
                    loads.append(os.getloadavg()[0])
                    print(f"# {coll} rep {rep} {k} (load {loads[-1]:.1f}): " + ", ".join(
                        f"{s}B {v['us']:.0f}us" for s, v in sorted(runs[k][-1].items())), flush=True)
            rows = make_rows(runs, variants, ring, peers, calib, coll, a.hosts, a.ppn)
            record["by_coll"][coll] = {"runs": runs, "rows": rows, "stamp": stamp(), "load_1min": loads}
            print_rows(coll, rows, ring, logs, peers, a)
            write_record(a.out, record)
    finally:
        net.down(st)
    record["load_after"] = os.getloadavg()
    write_record(a.out, record)


if __name__ == "__main__":
    main()
