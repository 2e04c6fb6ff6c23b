"""HARP's automatic allreduce choice against every forced flat algorithm, at several round-trip
times on the arena, 8 B to 256 MB; gloo and Open MPI beside them.

    python3 bench/vpc/tuner_bench.py --hosts 4 --delays 0,50us,500us --repeat 2 \\
        --out results/arena/tuner-rtt.json

Per one-way delay (0: the ideal arena; 50us: 0.1 ms RTT; 500us: 1 ms RTT; harp-cluster --delay)
a fresh cluster of --hosts hosts (one rank each) comes up, the link rate is measured (one TCP
stream), and scripts/calibrate.py --cluster measures the tcp line between hosts 0 and 1 (alpha =
half the round trip, beta): that file is HARP_CALIBRATION_FILE for every HARP run, as a user who
calibrated would have it. Then, per repetition, the harp-bench worker sweeps the sizes (three
sweeps: 8 B-64 KB, 256 KB-4 MB, 16 MB-256 MB, fewer iterations for the larger) once with HARP's
own choice ("auto") and once per --algos (the worker's algo=, every rank alike), then gloo and
Open MPI (--libs). Each figure is the median over repetitions of the slowest rank's time. Per
size: auto / best forced (the goal: <= 1.05), the algorithm harp-config --explain says the
tuner picks with that calibration, and HARP / gloo, HARP / MPI. One JSON, stamped.
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
from harp_dev.cluster import net  # noqa: E402
import linkrate  # noqa: E402
from stamp import stamp, write_record  # noqa: E402
from harp_dev.bench import check  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SWEEPS = [  # (min bytes, max bytes, factor, iterations, warm-up)
    (8, 64 << 10, 8, 40, 5),
    (256 << 10, 4 << 20, 4, 8, 2),
    (16 << 20, 256 << 20, 4, 2, 1),
]


def calibrate(name, path):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "calibrate.py"), "--cluster", name],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        raise RuntimeError(f"calibrate.py --cluster {name} failed: {r.stderr[-2000:]}")
    with open(path, "w") as f:
        f.write(r.stdout)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("tcp ")][0].split()
    return {"alpha_s": float(line[1]), "beta_s_per_byte": float(line[2]), "file": r.stdout}


def tuner_pick(calib, hosts, size):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), HARP_CALIBRATION_FILE=calib)
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", "--explain", "allreduce", str(size), "--hosts",
                        str(hosts), "--ppn", "1", "--transport", "tcp"], capture_output=True, text=True, env=env, timeout=60)
    m = re.search(r"^pick: (\w+) \((.*)\)$", r.stdout, re.M)
    if not m:
        raise RuntimeError(f"harp-config --explain: no pick: {r.stdout[-800:]} {r.stderr[-800:]}")
    return {"algo": m.group(1), "why": m.group(2)}


def samples_of(res, tag):
    """{size: [out-of-place us, in-place us]} (each the ranks' mean of one timed loop) and
    {size: the algorithm the ranks ran} from one merged worker result."""
    wrong = sum((r.get("oop_wrong") or 0) + (r.get("ip_wrong") or 0) for r in res["rows"])
    if wrong:
        raise RuntimeError(f"{tag}: {wrong} wrong values")
    return ({r["size"]: [t for t in (r.get("oop_us"), r.get("ip_us")) if t] for r in res["rows"]},
            {r["size"]: r.get("algo") for r in res["rows"]})


def run_one(name, spec, hosts, tmp, tag, algo, timeout):
    times, algos = {}, {}
    for i, (mn, mx, f, it, wu) in enumerate(SWEEPS):
        wa = arena_bench.worker_args(os.path.join(tmp, f"{tag}-{i}.json"), mn, mx, f, it, wu)
        wa["algo"] = algo
        t, a = samples_of(arena_bench.run_lib(name, spec, hosts, wa, timeout), tag)
        times.update(t)
        algos.update(a)
    return times, algos


def load_one(tmp, tag, hosts):
    """run_one's result from the per-rank files a run left in `tmp` (--from-dir)."""
    times, algos = {}, {}
    for i in range(len(SWEEPS)):
        t, a = samples_of(check.merge(os.path.join(tmp, f"{tag}-{i}.json"), tag, hosts), tag)
        times.update(t)
        algos.update(a)
    return times, algos


def summarise(runs, picks, forced):
    """Per size: every variant's median over its samples (2 timed loops, out of place and in place, per
    repetition: a single stalled loop moves a median of 2 repetitions x 2 loops less than a mean)."""
    sizes = sorted(next(iter(runs.values()))[0])
    def flat(reps, s):
        return [t for r in reps for t in r[s]]
    med = {k: {s: statistics.median(flat(reps, s)) for s in sizes} for k, reps in runs.items()}
    spread = {k: {s: (min(flat(reps, s)), max(flat(reps, s))) for s in sizes} for k, reps in runs.items()}
    rows = []
    for s in sizes:
        best = min(forced, key=lambda a: med[a][s])
        row = {"size": s, "auto_us": med["auto"][s], "auto_range_us": spread["auto"][s], "best": best,
               "best_us": med[best][s], "auto_over_best": med["auto"][s] / med[best][s], "pick": picks[s]["algo"],
               # The decision's quality free of job-to-job spread: the pick's own forced time over the best.
               "pick_forced_over_best": (med[picks[s]["algo"]][s] / med[best][s]) if picks[s]["algo"] in med else None,
               "forced_us": {a: med[a][s] for a in forced}}
        for peer in ("gloo", "mpi"):
            if peer in med:
                row[f"{peer}_us"] = med[peer][s]
                row[f"harp_over_{peer}"] = med["auto"][s] / med[peer][s]
        rows.append(row)
    return rows


def print_rows(title, rows, forced):
    print(f"## {title}")
    head = f"{'bytes':>10} {'pick':>18} {'auto us':>11} {'best forced':>18} {'best us':>11} {'auto/best':>9} {'pick/best':>9}"
    head += "".join(f" {a[:10]:>10}" for a in forced) + f" {'gloo us':>10} {'mpi us':>10}"
    print(head)
    for r in rows:
        line = (f"{r['size']:>10} {r['pick']:>18} {r['auto_us']:11.1f} {r['best']:>18} {r['best_us']:11.1f} "
                f"{r['auto_over_best']:9.3f} {r['pick_forced_over_best'] or float('nan'):9.3f}" + "".join(f" {r['forced_us'][a]:10.1f}" for a in forced))
        line += f" {r.get('gloo_us', float('nan')):10.1f} {r.get('mpi_us', float('nan')):10.1f}"
        print(line + ("   > 1.05" if r["auto_over_best"] > 1.05 else ""))
    sys.stdout.flush()


def report(record, d, by, calib, a, forced):
    sizes = sorted(by["runs"]["auto"][0])
    picks = {s: tuner_pick(calib, a.hosts, s) for s in sizes}
    # What auto ran (every rank's result row names it), against what --explain says.
    ran = {s: sorted({al.get(s) for al in by["runtime_algos"]["auto"]} - {None}) for s in sizes}
    rows = summarise(by["runs"], picks, forced)
    for r in rows:
        r["auto_ran"] = ran[r["size"]]
    record["by_delay"][d] = dict(by, picks=picks, rows=rows, stamp=stamp())
    print_rows(f"allreduce float32, {a.hosts} hosts x 1 rank, {a.rate}, one-way delay {d}", rows, forced)
    worst = max(r["auto_over_best"] for r in rows)
    pf = [r["pick_forced_over_best"] for r in rows if r["pick_forced_over_best"]]
    print(f"worst auto / best forced: {worst:.3f}; sizes over 1.05: "
          f"{[r['size'] for r in rows if r['auto_over_best'] > 1.05]}; worst pick forced / best: "
          f"{max(pf) if pf else float('nan'):.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="tuner")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delays", default="0,50us,500us", help="one-way delays, comma-separated (0: none)")
    ap.add_argument("--algos", default="ring,recursive_doubling,halving_doubling,ring_weighted")
    ap.add_argument("--libs", default="gloo,mpi", help="peers run beside HARP (gloo, mpi; '' for none)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", required=True)
    ap.add_argument("--from-dir", help="summarise the per-rank files of an earlier run (its temporary folder) "
                    "instead of running; needs --from-record")
    ap.add_argument("--from-record", help="that run's JSON (clusters, calibrations, links)")
    a = ap.parse_args()
    forced = [x for x in a.algos.split(",") if x]
    peers = [x for x in a.libs.split(",") if x]
    tmp = tempfile.mkdtemp(prefix="tuner-bench-")
    record = {"stamp_before": stamp(), "command": " ".join(sys.argv), "sweeps": SWEEPS, "by_delay": {}}
    if a.from_dir:
        # Summarise a run's per-rank files again (they stay in its temporary folder); the clusters,
        # calibrations and links come from that run's record (--from-record).
        old = json.load(open(a.from_record))
        record["summarised_from"] = {"dir": a.from_dir, "record": a.from_record, "command": old.get("command"),
                                     "stamp_before": old.get("stamp_before")}
        for d, by in old["by_delay"].items():
            keys = list(by["runs"])
            runs, algos = {k: [] for k in keys}, {k: [] for k in keys}
            for rep in range(len(by["runs"]["auto"])):
                for k in keys:
                    t, al = load_one(a.from_dir, f"{d}-{rep}-{k}", a.hosts)
                    runs[k].append(t)
                    algos[k].append(al)
            report(record, d, dict(by, runs=runs, runtime_algos=algos), os.path.join(a.from_dir, f"calib-{d}.txt"),
                   a, [k for k in keys if k in forced])
        write_record(a.out, record)
        return
    for d in a.delays.split(","):
        st = net.up(a.name, a.hosts, rate=a.rate, delay=None if d in ("0", "") else d)
        try:
            calib = os.path.join(tmp, f"calib-{d}.txt")
            cal = calibrate(a.name, calib)
            link = statistics.median(linkrate.measure(st, 1, 0) for _ in range(3))
            print(f"# delay {d}: RTT asked {st.get('rtt_asked_us')} measured "
                  f"{(st.get('rtt_measured_us') or {}).get('median')} us; calibrated alpha {cal['alpha_s'] * 1e6:.0f} us,"
                  f" beta {cal['beta_s_per_byte'] * 1e9:.2f} ns/B; link {link:.1f} MB/s", flush=True)
            harp_spec = "harp@HARP_CALIBRATION_FILE=" + calib
            runs = {k: [] for k in ["auto"] + forced + peers}
            algos = {k: [] for k in runs}
            for rep in range(a.repeat):
                # ABBA: odd repetitions run the variants in reverse order, so a drift in the
                # machine's load does not favour whichever variant runs first.
                for k in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
                    spec = k if k in peers else harp_spec
                    algo = None if k == "auto" or k in peers else k
                    t, al = run_one(a.name, spec, a.hosts, tmp, f"{d}-{rep}-{k}", algo, a.timeout)
                    runs[k].append(t)
                    algos[k].append(al)
                    print(f"# delay {d} rep {rep} {k}: " + ", ".join(f"{s}B {min(t[s]):.0f}us" for s in sorted(t)),
                          flush=True)
            by = {"cluster": {k: st.get(k) for k in (
                "hosts", "rate", "mtu", "delay_ns", "delay_line_ns", "rtt_asked_us", "rtt_measured_us")},
                "link_MBps": link, "calibration": cal, "runs": runs, "runtime_algos": algos, "dir": tmp}
            report(record, d, by, calib, a, forced)
        finally:
            net.down(st)
    write_record(a.out, record)


if __name__ == "__main__":
    main()
