"""Wire compression on the arena: fp16/bf16/top-k vs dense HARP, side by side in one run.

    python3 bench/vpc/compress_bench.py --hosts 4 --rate 1gbit --mb 64 --repeat 3 \\
        --out results/arena/compress.json

Brings up arena cluster --name (default cmp17; taken down at the end, also on failure),
measures the link payload rate (linkrate.py), writes a calibration file whose tcp line has
beta = 1 / link rate (the gate's view of this link, HARP_CALIBRATION_FILE), then for each
repetition runs one job of --hosts ranks (one per host) that times, in one process and one
after the other, a --mb MB float32 allreduce: dense (compress="none"), fp16, bf16 and
top-k 1% with error feedback (gated, not forced: the gate must choose compression itself).
Per mode: median time, busbw counted in float32 bytes (2(p-1)/p * bytes / time), the ratio
to dense, bytes this rank's compressed algorithm posted (harp.compress.stats) against the
formula, the bytes eth0 really sent (/sys/class/net/eth0/statistics/tx_bytes in the host's
namespace, TCP/IP headers included), and for fp16/bf16 the largest error against the
derived bound (harp.compress.error_bound). Then the same modes on the unshaped local
machine (--local-ranks ranks over loopback tcp, builtin calibration): the gate must switch
compression off (compressed_calls == 0) and each mode's time is compared with dense.
Writes one JSON stamped before and after (bench/vpc/stamp.py).

    python3 bench/vpc/compress_bench.py --gate-overhead --local-ranks 4 --out .../gate-overhead.json

Only the unshaped check, as a paired A/B in one job: communicator A has HARP_COMPRESS unset,
B (A.split, made after HARP_COMPRESS=<spec> is set, so its engine reads it) has each spec in
turn; the gate must turn it off (compressed_calls == 0) and the same plain calls
(comm.allreduce(x), the fast path) alternate A, B, A, B... per size, so load drifts hit both
alike. Reports median(B) / median(A) per spec and size (slowest rank per call).
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
PYDIR = os.path.abspath(os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)
from harp_dev.cluster import net, topology as topo  # noqa: E402
import linkrate  # noqa: E402
from stamp import stamp  # noqa: E402

MODES = ["none", "fp16", "bf16", "topk:0.01,ef"]

WORKER = r'''
import json, os, sys, time
import numpy as np
import harp
from harp import compress as hc

out, mb, iters, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split("/")
comm = harp.init()
p, r = comm.size, comm.rank
n = mb * (1 << 20) // 4
def data(rank):
    return np.random.default_rng(rank).standard_normal(n).astype(np.float32)
x = data(r)
def tx():
    try:
        with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None
res = {}
for mode in modes:
    buf = np.empty_like(x)
    comm.allreduce(x, buf, compress=mode, key="bench")  # warm-up (and first residual)
    s0, t0 = hc.stats(comm), tx()
    times = []
    for _ in range(iters):
        comm.barrier()
        a = time.perf_counter()
        comm.allreduce(x, buf, compress=mode, key="bench")
        times.append(time.perf_counter() - a)
    s1, t1 = hc.stats(comm), tx()
    row = {"times_s": times, "bytes_sent_per_call": (s1["bytes_sent"] - s0["bytes_sent"]) / iters,
           "eth0_tx_per_call": None if t0 is None or t1 is None else (t1 - t0) / iters,
           "compressed_calls": s1["compressed_calls"] - s0["compressed_calls"],
           "dense_calls": s1["dense_calls"] - s0["dense_calls"]}
    if r == 0 and mode in ("fp16", "bf16"):
        xs = np.stack([data(q) for q in range(p)]).astype(np.float64)
        exact, abs_sum = xs.sum(0), np.abs(xs).sum(0)
        del xs
        err = np.abs(buf.astype(np.float64) - exact)
        bound = hc.error_bound(abs_sum, p, mode)
        row["max_err"] = float(err.max())
        row["max_err_over_bound"] = float((err / np.maximum(bound, 1e-300)).max())
        row["within_bound"] = bool(np.all(err <= bound))
    if mode.startswith("topk"):
        row["formula_bytes"] = hc.topk_bytes(n, p, mode)
    elif mode != "none":
        row["formula_bytes"] = 2 * (p - 1) * n * 2 / p
    res[mode] = row
    hc.clear(comm)
with open(f"{out}.rank{r}", "w") as f:
    json.dump(res, f)
comm.destroy()
'''


GATE_WORKER = r'''
import json, os, statistics, sys, time
import numpy as np
import harp
from harp import compress as hc

out, iters, specs, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split("/"), [int(x) for x in sys.argv[4].split(",")]
os.environ.pop("HARP_COMPRESS", None)
a = harp.init()
a.allreduce(np.ones(16, np.float32))  # A's engine now exists, without HARP_COMPRESS
res = {}
for spec in specs:
    os.environ["HARP_COMPRESS"] = spec
    b = a.split(0, a.rank)
    b.allreduce(np.ones(16, np.float32))  # B's engine reads HARP_COMPRESS=spec
    for n in sizes:
        x = np.ones(n // 4, np.float32)
        ta, tb = [], []
        for i in range(iters):
            for c, t in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
                c.barrier()
                s = time.perf_counter()
                c.allreduce(x)
                t.append(time.perf_counter() - s)
        res[f"{spec}|{n}"] = {"a": ta, "b": tb, "b_compressed_calls": hc.stats(b)["compressed_calls"]}
    b.destroy()
with open(f"{out}.rank{a.rank}", "w") as f:
    json.dump(res, f)
a.destroy()
'''


def gate_overhead(a, env, record):
    """The unshaped A/B (see the module doc): B (HARP_COMPRESS=spec, gated off) over A (unset)."""
    tmp = tempfile.mkdtemp(prefix="gate-overhead-")
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(GATE_WORKER)
    launch = [os.path.join(os.path.dirname(sys.executable), "harp-run")]
    if not os.path.exists(launch[0]):
        launch = [sys.executable, "-m", "harp.launch"]
    specs, sizes = ["fp16", "bf16", "topk:0.01,ef"], [4096, 65536, 1 << 20, 16 << 20]
    cmd = launch + ["-n", str(a.local_ranks), sys.executable, worker, os.path.join(tmp, "g"), str(a.gate_iters),
                    "/".join(specs), ",".join(map(str, sizes))]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
    if r.returncode:
        raise RuntimeError(f"gate overhead job failed ({r.returncode}): {r.stderr[-3000:]}")
    ranks = [json.load(open(os.path.join(tmp, x))) for x in sorted(os.listdir(tmp)) if x.startswith("g.rank")]
    summary = {}
    print(f"## unshaped loopback, {a.local_ranks} ranks: HARP_COMPRESS=spec (gated) over unset, paired calls")
    for key in ranks[0]:
        ta = [max(rk[key]["a"][i] for rk in ranks) for i in range(len(ranks[0][key]["a"]))]
        tb = [max(rk[key]["b"][i] for rk in ranks) for i in range(len(ranks[0][key]["b"]))]
        ratio = statistics.median(tb) / statistics.median(ta)
        comp = sum(rk[key]["b_compressed_calls"] for rk in ranks)
        summary[key] = {"a_median_s": statistics.median(ta), "b_median_s": statistics.median(tb),
                        "b_over_a": ratio, "compressed_calls_all_ranks": comp}
        print(f"{key:>24} A {statistics.median(ta) * 1e6:10.1f} us  B {statistics.median(tb) * 1e6:10.1f} us  "
              f"B/A {ratio:.3f}  compressed calls {comp}")
    record["gate_overhead"] = {"runs": ranks, "summary": summary, "iters": a.gate_iters}


def run_job(cmd_prefix, tmp, tag, mb, iters, modes, env, timeout):
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    out = os.path.join(tmp, tag)
    cmd = cmd_prefix + [sys.executable, worker, out, str(mb), str(iters), "/".join(modes)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{tag} failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-3000:]}")
    ranks = sorted(x for x in os.listdir(tmp) if x.startswith(tag + ".rank"))
    return [json.load(open(os.path.join(tmp, x))) for x in ranks]


def summarise(reps, p, mb, link):
    """reps: list over repetitions of per-rank results -> per mode figures (rank 0's view; times: max over ranks)."""
    nbytes = mb * (1 << 20)
    out = {}
    for mode in reps[0][0]:
        ts = [max(statistics.median(rank[mode]["times_s"]) for rank in rep) for rep in reps]
        med = statistics.median(ts)
        busbw = 2 * (p - 1) / p * nbytes / med / 1e6
        r0 = reps[-1][0][mode]
        row = {"s_median": med, "s_min": min(ts), "s_max": max(ts), "busbw_MBps_f32": busbw,
               "busbw_over_link": busbw / link if link else None,
               "compressed_calls": sum(rep[0][mode]["compressed_calls"] for rep in reps),
               "dense_calls": sum(rep[0][mode]["dense_calls"] for rep in reps),
               "bytes_sent_per_call": r0["bytes_sent_per_call"], "formula_bytes": r0.get("formula_bytes"),
               "eth0_tx_per_call": r0["eth0_tx_per_call"]}
        for k in ("max_err", "max_err_over_bound", "within_bound"):
            if k in r0:
                row[k] = r0[k]
        out[mode] = row
    dense = out["none"]["s_median"]
    for row in out.values():
        row["speedup_vs_dense"] = dense / row["s_median"]
    return out


def print_table(title, summ):
    print(f"## {title}")
    print(f"{'mode':>14} {'median s':>9} {'min..max s':>16} {'busbw MB/s':>10} {'/link':>6} {'x dense':>7} "
          f"{'comp/dense calls':>16} {'B sent/call':>12} {'formula':>12} {'eth0 tx':>12} {'err/bound':>9}")
    for mode, r in summ.items():
        frac = f"{r['busbw_over_link']:.3f}" if r["busbw_over_link"] else ""
        form = f"{r['formula_bytes']:.0f}" if r["formula_bytes"] else ""
        eth = f"{r['eth0_tx_per_call']:.0f}" if r["eth0_tx_per_call"] else ""
        eb = f"{r['max_err_over_bound']:.3f}" if "max_err_over_bound" in r else ""
        print(f"{mode:>14} {r['s_median']:9.3f} {r['s_min']:7.3f}..{r['s_max']:<7.3f} {r['busbw_MBps_f32']:10.1f} "
              f"{frac:>6} {r['speedup_vs_dense']:7.2f} {r['compressed_calls']:>7}/{r['dense_calls']:<8} "
              f"{r['bytes_sent_per_call']:12.0f} {form:>12} {eth:>12} {eb:>9}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="cmp17")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--local-ranks", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gate-overhead", action="store_true", help="only the unshaped A/B check (no arena)")
    ap.add_argument("--gate-iters", type=int, default=40)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="compress-bench-")
    env = dict(os.environ, PYTHONPATH=PYDIR, OMP_NUM_THREADS="1", HARP_TRANSPORT="tcp")
    record = {"stamp_before": stamp(), "command": " ".join(sys.argv), "modes": MODES}
    if a.gate_overhead:
        gate_overhead(a, env, record)
        record["stamp_after"] = stamp()
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)
        return
    st = topo.load(a.name) or net.up(a.name, a.hosts, rate=a.rate)
    try:
        record["cluster"] = {k: st[k] for k in ("hosts", "rate", "mtu", "congestion")}
        record["link_MBps"] = [linkrate.measure(st, 1, 0) for _ in range(3)]
        link = statistics.median(record["link_MBps"])
        print(f"# link payload rate: {record['link_MBps']} MB/s, median {link:.1f}", flush=True)
        cal = os.path.join(tmp, "link.cal")
        with open(cal, "w") as f:
            f.write(f"tcp 50e-6 {1 / (link * 1e6):.4g} 1.0e-10\n")
        record["calibration"] = open(cal).read()
        arena_env = dict(env, HARP_CALIBRATION_FILE=cal)
        prefix = [sys.executable, "-m", "harp_dev.cluster", "run", "--name", a.name, "--hosts", str(a.hosts),
                  "--timeout", str(a.timeout), "--"]
        reps = []
        for rep in range(a.repeat):
            reps.append(run_job(prefix, tmp, f"arena{rep}", a.mb, a.iters, MODES, arena_env, a.timeout + 60))
            print(f"# arena rep {rep}: " + ", ".join(f"{m} {statistics.median(reps[-1][0][m]['times_s']):.3f}s"
                                                     for m in MODES), flush=True)
        record["arena"] = {"runs": reps, "summary": summarise(reps, a.hosts, a.mb, link)}
        print_table(f"{a.mb} MB float32 allreduce, {a.hosts} hosts x 1 rank, {a.rate}, link {link:.1f} MB/s",
                    record["arena"]["summary"])
    finally:
        net.down(st)
    local = []
    launch = [os.path.join(os.path.dirname(sys.executable), "harp-run")]
    if not os.path.exists(launch[0]):
        launch = [sys.executable, "-m", "harp.launch"]
    for rep in range(a.repeat):
        local.append(run_job(launch + ["-n", str(a.local_ranks)], tmp, f"local{rep}", a.mb, a.iters, MODES, env,
                             a.timeout))
    record["local"] = {"runs": local, "summary": summarise(local, a.local_ranks, a.mb, None)}
    print_table(f"{a.mb} MB float32 allreduce, {a.local_ranks} local ranks, unshaped loopback tcp",
                record["local"]["summary"])
    record["stamp_after"] = stamp()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
