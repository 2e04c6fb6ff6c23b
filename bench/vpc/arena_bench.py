"""HARP vs gloo vs Open MPI allreduce across arena hosts, against the measured link rate.

    python3 bench/vpc/arena_bench.py --hosts 2,4 --rate 1gbit --repeat 3 --out results/arena/allreduce.json

Brings up (or reuses) arena cluster --name (default vpc) with max(--hosts)
hosts, measures the link payload rate with a single TCP stream (linkrate.py,
3 times), then for each host count and each repetition runs the harp-bench
worker (python -m harp_dev.bench.workers harp|gloo|mpi) as one rank per host:
HARP and gloo under the arena's harp launcher (HARP_UNIQUE_ID; gloo uses the
MASTER_ADDR/RANK the launcher also sets, GLOO_SOCKET_IFNAME=eth0), Open MPI
(mpi4py, TCP BTL) under the arena's mpirun. Two sweeps per library: latency
(8 B, --lat-iters) and bandwidth (1 MB .. 64 MB x4, --bw-iters). Reports
median and spread over repetitions, busbw in MB/s and as a fraction of the
link rate. Writes one JSON with a provenance stamp.

    python3 bench/vpc/arena_bench.py --name lat8 --hosts 8 --no-bw --repeat 3 \
        --libs mpi,harp,harp@HARP_SPIN=256 --out results/arena/lat8.json

compares settings of one library in the same run (LIB@VAR=V+VAR2=V2).

    python3 bench/vpc/arena_bench.py --name slow --hosts 4 --host-rate 3=500mbit --repeat 3 \
        --out results/arena/allreduce-slow-host.json

runs with one host's link slower (its line's rate measured too, so busbw is also shown against it).

    python3 bench/vpc/arena_bench.py --name rtt --hosts 4,8 --delay 500us --no-bw --repeat 3 \
        --out results/arena/lat-rtt1ms.json

puts round-trip time on the links (harp-cluster --delay, one way; harp-delayline) and reports,
beside each library's 8 B time, the RTT-bound model of the algorithm HARP's tuner picks there
(rounds x RTT, the issue's definition; a round of recursive doubling costs one one-way delay
when both partners send at once, so rounds x RTT / 2 is also shown, the tighter bound).
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
PYDIR = os.path.join(HERE, "..", "..", "python")
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)
from harp_dev.bench import check, sweep  # noqa: E402
from harp_dev.cluster import net, topology as topo  # noqa: E402
import linkrate  # noqa: E402
from stamp import stamp  # noqa: E402

LIBS = {"harp": "harp", "gloo": "harp", "mpi": "mpirun"}   # library -> arena launcher


def worker_args(out, minb, maxb, factor, iters, warmup):
    return {"coll": "allreduce", "minbytes": minb, "maxbytes": maxb, "factor": factor, "step": 0, "iters": iters,
            "warmup": warmup, "check": 1, "dtype": "float32", "op": "sum", "root": 0, "algo": None,
            "transport": None, "out": out, "progress": False}


def split_lib(spec):
    """"harp@HARP_SPIN=256+HARP_SPIN_BYTES=1K" -> ("harp", {"HARP_SPIN": "256", ...}): a library run
    with extra environment (a variant of its settings, in the same run as the others)."""
    lib, _, extra = spec.partition("@")
    env = dict(kv.split("=", 1) for kv in extra.split("+")) if extra else {}
    if lib not in LIBS:
        raise SystemExit(f"arena_bench: unknown library '{lib}' in '{spec}' (known: {', '.join(LIBS)})")
    return lib, env


def run_lib(name, spec, hosts, wargs, timeout, ppn=1, env=None):
    """The harp-bench worker of library `spec` (LIB or LIB@VAR=V+...) as `ppn` ranks on each of `hosts`
    arena hosts, `env` more variables for the ranks; the ranks' results merged."""
    lib, extra = split_lib(spec)
    ranks_env = dict(os.environ, PYTHONPATH=os.path.abspath(PYDIR), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    ranks_env.update(env or {})
    ranks_env.update(extra)
    cmd = [sys.executable, "-m", "harp_dev.cluster", "run", "--name", name, "--hosts", str(hosts),
           *(["--ppn", str(ppn)] if ppn != 1 else []), "--launcher", LIBS[lib], "--timeout", str(timeout), "--",
           sys.executable, "-m", "harp_dev.bench.workers", lib, json.dumps(wargs)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ranks_env, timeout=timeout + 60)
    if r.returncode:
        where = f"{hosts} hosts" if ppn == 1 else f"{hosts}x{ppn}"
        raise RuntimeError(f"{lib} on {where} failed ({r.returncode}): {r.stderr[-2000:]}")
    # every rank checked its own results and wrote <out>.rank<r> (harp_dev.bench.check); merged here
    return check.merge(wargs["out"], lib, hosts * ppn)


def time_of(row):
    return row.get("ip_us") or row.get("oop_us")


def summarise(runs, hosts, link):
    """runs[lib] = list over repetitions of {size: us}; -> per size: median/min/max us, busbw, fraction."""
    out = {}
    for lib, reps in runs.items():
        out[lib] = {}
        for size in sorted(reps[0]):
            ts = [r[size] for r in reps if r.get(size)]
            med = statistics.median(ts)
            bw = size / (med * 1e-6) / 1e6 * sweep.bus_factor("allreduce", hosts)
            out[lib][size] = {"us_median": med, "us_min": min(ts), "us_max": max(ts), "busbw_MBps": bw,
                              "busbw_over_link": bw / link if size >= 1 << 20 else None}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="vpc")
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--libs", default="harp,gloo,mpi",
                    help="libraries, in run order; LIB@VAR=V+VAR2=V2 runs LIB with extra environment "
                         "(e.g. harp@HARP_SPIN=256), reported under that whole name")
    ap.add_argument("--no-bw", action="store_true", help="latency (8 B) only")
    ap.add_argument("--lat-iters", type=int, default=200)
    ap.add_argument("--bw-iters", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--delay", help="one-way delay between hosts (harp-cluster --delay), e.g. 50us, 500us")
    ap.add_argument("--jitter")
    ap.add_argument("--loss")
    ap.add_argument("--host-rate", action="append", default=[],
                    help="a slower host (harp-cluster --host-rate), e.g. 3=500mbit; repeatable")
    ap.add_argument("--mtu", type=int, default=1500, choices=[1500, 9000],
                    help="9000 with --loss keeps the delay line's frame rate low (offloads are off then)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    hosts_list = [int(x) for x in a.hosts.split(",")]
    libs = a.libs.split(",")
    st = topo.load(a.name)
    made = st is None
    if made:
        st = net.up(a.name, max(hosts_list), rate=a.rate, mtu=a.mtu, delay=a.delay, jitter=a.jitter, loss=a.loss,
                    host_rate=a.host_rate or None)
    try:
        record = {"stamp_before": stamp(), "cluster": {k: st.get(k) for k in (
                      "hosts", "rate", "mtu", "congestion", "delay_ns", "jitter_ns", "loss_ppm", "delay_line_ns",
                      "rtt_asked_us", "rtt_measured_us", "host_rate")},
                  "command": " ".join(sys.argv), "link_MBps": [linkrate.measure(st, 1, 0) for _ in range(3)]}
        link = statistics.median(record["link_MBps"])
        if a.host_rate:  # the slow host's own line, for the fraction of the slowest link
            slow = [int(h.split("=")[0]) for h in a.host_rate]
            record["slow_link_MBps"] = {h: statistics.median(linkrate.measure(st, h, 0 if h else 1) for _ in range(3))
                                        for h in slow}
            print(f"# slower hosts' line (single TCP stream): {record['slow_link_MBps']} MB/s", flush=True)
        print(f"# link payload rate (single TCP stream, host1->host0): {record['link_MBps']} MB/s, median {link:.1f}",
              flush=True)
        record["by_hosts"] = {}
        tmp = tempfile.mkdtemp(prefix="arena-bench-")
        for h in hosts_list:
            runs = {lib: [] for lib in libs}
            for rep in range(a.repeat):
                for lib in libs:
                    times = {}
                    sweeps = {"lat": (8, 8, 2, a.lat_iters, 20), "bw": (1 << 20, 64 << 20, 4, a.bw_iters, 2)}
                    if a.no_bw:
                        del sweeps["bw"]
                    for tag, (mn, mx, f, it, wu) in sweeps.items():
                        wa = worker_args(os.path.join(tmp, f"{libs.index(lib)}-{h}-{rep}-{tag}.json"),
                                         mn, mx, f, it, wu)
                        res = run_lib(a.name, lib, h, wa, a.timeout)
                        wrong = sum((r.get("oop_wrong") or 0) + (r.get("ip_wrong") or 0) for r in res["rows"])
                        if wrong:
                            raise RuntimeError(f"{lib}: {wrong} wrong values at {h} hosts")
                        times.update({r["size"]: time_of(r) for r in res["rows"]})
                    runs[lib].append(times)
                    print(f"# {h} hosts rep {rep} {lib}: " + ", ".join(f"{s}B {t:.1f}us" for s, t in
                                                                       sorted(times.items())), flush=True)
            summ = summarise(runs, h, link)
            record["by_hosts"][h] = {"runs": runs, "summary": summ, "model": rtt_model(st, h)}
            print_summary(h, summ, link)
            if st.get("delay_line"):
                m = record["by_hosts"][h]["model"]
                print(f"## RTT model, {h} hosts: tuner picks {m['algo']} ({m['rounds']} rounds), RTT {m['rtt_us']:.0f} us: "
                      f"rounds x RTT {m['rounds_x_rtt_us']:.0f} us, rounds x RTT/2 {m['rounds_x_rtt_us'] / 2:.0f} us")
                for lib in libs:
                    t8 = summ[lib][8]["us_median"]
                    print(f"   {lib:>5}: 8 B {t8:.0f} us = {t8 / m['rounds_x_rtt_us']:.2f} x rounds x RTT")
                if "harp" in summ and "gloo" in summ:
                    print(f"   harp / gloo {summ['harp'][8]['us_median'] / summ['gloo'][8]['us_median']:.2f}")
                if "harp" in summ and "mpi" in summ:
                    print(f"   harp / mpi  {summ['harp'][8]['us_median'] / summ['mpi'][8]['us_median']:.2f}")
        record["stamp_after"] = stamp()
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)
    finally:
        if made:
            net.down(st)


ROUNDS = {  # rounds of message exchange of an 8-byte allreduce on p ranks, per algorithm
    "recursive_doubling": lambda p: (p - 1).bit_length() + (0 if p & (p - 1) == 0 else 1),
    "halving_doubling": lambda p: 2 * (p - 1).bit_length() + (0 if p & (p - 1) == 0 else 2),
    "ring": lambda p: 2 * (p - 1),
}


def rtt_model(st, hosts):
    """The algorithm HARP's tuner picks for an 8-byte float32 allreduce on `hosts` tcp ranks
    (harp-config --explain) and its RTT-bound time (rounds x the RTT measured at up)."""
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", "--explain", "allreduce", "8", "--ranks", str(hosts),
                        "--transport", "tcp"], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=PYDIR))
    m = re.search(r"^pick: (\w+)", r.stdout, re.M)
    if not m or m.group(1) not in ROUNDS:
        raise RuntimeError(f"arena_bench: no RTT model for the tuner's pick: {r.stdout[-500:]}{r.stderr[-500:]}")
    algo = m.group(1)
    rtt = (st.get("rtt_measured_us") or {}).get("median", 0.0)
    rounds = ROUNDS[algo](hosts)
    return {"algo": algo, "rounds": rounds, "rtt_us": rtt, "rounds_x_rtt_us": rounds * rtt,
            "explain": r.stdout[-1500:]}


def print_summary(h, summ, link):
    print(f"## allreduce float32, {h} hosts x 1 rank, link {link:.1f} MB/s")
    print(f"{'lib':>5} {'size':>10} {'median us':>12} {'min..max us':>22} {'busbw MB/s':>11} {'/link':>6}")
    for lib, rows in summ.items():
        for size, r in rows.items():
            frac = f"{r['busbw_over_link']:.3f}" if r["busbw_over_link"] else ""
            print(f"{lib:>5} {size:>10} {r['us_median']:12.1f} {r['us_min']:10.1f}..{r['us_max']:<10.1f} "
                  f"{r['busbw_MBps']:11.2f} {frac:>6}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
