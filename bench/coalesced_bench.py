"""Coalesced allreduce (tensor fusion): 64 float32 tensors of 4 KB-2 MB (32 MB in all)
as one allreduce_coalesced call, against one allreduce of the same 32 MB already flat, and 64
separate allreduce calls; side by side in one job, iterations interleaved.

    python3 bench/coalesced_bench.py --where local --ranks 4 --iters 10 --repeat 3 \\
        --out bench/vpc/results/coalesced-local.json
    python3 bench/coalesced_bench.py --where arena --ranks 4 --rate 1gbit --iters 5 --repeat 3 \\
        --out bench/vpc/results/coalesced-arena.json

local: --ranks ranks over loopback tcp (harp-run). arena: harp-cluster --name (default coal17,
taken down at the end, also on failure), one rank per host, link payload rate measured first
(bench/vpc/linkrate.py). Modes: flat (one 32 MB allreduce), coalesced (the default,
HARP_COALESCE=sg: one ring schedule over the 64 arrays, no copies), fused (HARP_COALESCE=fuse
with its defaults: HARP_FUSION_BYTES 64M, HARP_FUSION_ALONE_BYTES 128K), coalesced_F_A (fuse
with an F MB buffer, arrays of A KB or more alone: 64_512, 64_4096 = everything fused into one
allreduce, 8_128 = 4 MB chunks whose packing overlaps the reductions), separate (64 blocking calls). Per mode: median over
repetitions of (median over iterations of the slowest rank's time), min..max, busbw
(2(p-1)/p x 32 MB / time), its fraction of the link (arena), and the ratios
coalesced / flat (target <= 1.1) and separate / coalesced (target >= 3). One JSON stamped
before and after (bench/vpc/stamp.py).
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
PYDIR = os.path.abspath(os.path.join(HERE, "..", "python"))
sys.path.insert(0, PYDIR)
sys.path.insert(0, os.path.join(HERE, "vpc"))
from stamp import stamp  # noqa: E402

# "coalesced": the defaults (HARP_COALESCE=sg, one list schedule, no copies); "fused": HARP_COALESCE=fuse
# with its defaults; coalesced_F_A: fuse with HARP_FUSION_BYTES F (MB), HARP_FUSION_ALONE_BYTES A (KB)
MODES = ["flat", "coalesced", "fused", "coalesced_64_512", "coalesced_64_4096", "coalesced_8_128", "separate"]
TOTAL = 32 << 20

WORKER = r'''
import json, os, sys, time
import numpy as np
import harp
from harp.coalesce import FusionState

out, iters, sizes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
comm = harp.init()
flat = np.zeros(sum(sizes) // 4, np.float32)  # zeros: no overflow however many iterations
ts = [np.zeros(s // 4, np.float32) for s in sizes]

def run(mode):
    if mode == "flat":
        comm.allreduce(flat)
    elif mode == "separate":
        for t in ts:
            comm.allreduce(t)
    else:
        os.environ["HARP_COALESCE"] = "sg" if mode == "coalesced" else "fuse"
        calls = comm.calls
        if calls.fusion is None:
            calls.fusion = FusionState()
        if mode.startswith("coalesced_"):
            f, al = mode.split("_")[1:]
            calls.fusion.set_sizes((int(f) << 20) // 2, int(al) << 10)
        else:
            calls.fusion.set_sizes()  # the defaults (HARP_FUSION_BYTES, HARP_FUSION_ALONE_BYTES)
        comm.allreduce_coalesced(ts)

modes = sys.argv[4].split("/")
res = {m: [] for m in modes}
for m in modes:
    run(m)  # warm-up: connections, buffers
for _ in range(iters):
    for m in modes:
        comm.barrier()
        a = time.perf_counter()
        run(m)
        res[m].append(time.perf_counter() - a)
with open(f"{out}.rank{comm.rank}", "w") as f:
    json.dump({"times_s": res}, f)
comm.destroy()
'''


def tensor_sizes(n=64, lo=4 << 10, hi=2 << 20, total=TOTAL):
    """n sizes (multiples of 4 bytes) from lo to hi, s_i = lo + (hi - lo) (i/(n-1))^a with a chosen so
    they sum to `total`, in a fixed shuffled order (mixed sizes, as in a model's gradient list)."""
    def sizes(a):
        return [int(lo + (hi - lo) * (i / (n - 1)) ** a) // 4 * 4 for i in range(n)]
    a_lo, a_hi = 0.01, 50.0
    for _ in range(100):
        mid = (a_lo + a_hi) / 2
        a_lo, a_hi = (mid, a_hi) if sum(sizes(mid)) > total else (a_lo, mid)
    s = sizes(a_hi)
    s[n // 2] += total - sum(s)
    order = sorted(range(n), key=lambda i: (i * 37) % n)
    return [s[i] for i in order]


def run_job(prefix, tmp, tag, iters, sizes, env, timeout):
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    out = os.path.join(tmp, tag)
    cmd = prefix + [sys.executable, worker, out, str(iters), json.dumps(sizes), "/".join(MODES)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{tag} failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-3000:]}")
    ranks = sorted(x for x in os.listdir(tmp) if x.startswith(tag + ".rank"))
    return [json.load(open(os.path.join(tmp, x))) for x in ranks]


def summarise(reps, p, link):
    out = {}
    for m in MODES:
        per_rep = []
        for rep in reps:
            slowest = [max(rank["times_s"][m][i] for rank in rep) for i in range(len(rep[0]["times_s"][m]))]
            per_rep.append(statistics.median(slowest))
        med = statistics.median(per_rep)
        busbw = 2 * (p - 1) / p * TOTAL / med / 1e6
        out[m] = {"s_median": med, "s_min": min(per_rep), "s_max": max(per_rep), "per_rep_s": per_rep,
                  "busbw_MBps": busbw, "busbw_over_link": busbw / link if link else None}
    ratios = {}
    for m in MODES:
        if m.startswith("coalesced"):
            ratios[f"{m}_over_flat"] = out[m]["s_median"] / out["flat"]["s_median"]
            ratios[f"separate_over_{m}"] = out["separate"]["s_median"] / out[m]["s_median"]
    return {"modes": out, "ratios": ratios}


def print_table(title, summ):
    print(f"## {title}")
    print(f"{'mode':>14} {'median s':>9} {'min..max s':>17} {'busbw MB/s':>10} {'/link':>6}")
    for m, r in summ["modes"].items():
        frac = f"{r['busbw_over_link']:.3f}" if r["busbw_over_link"] else ""
        print(f"{m:>14} {r['s_median']:9.4f} {r['s_min']:8.4f}..{r['s_max']:<8.4f} {r['busbw_MBps']:10.1f} {frac:>6}")
    print("ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in summ["ratios"].items()))
    sys.stdout.flush()


def arena(a, tmp, env, sizes, record):
    from harp.cluster import net, topology as topo
    import linkrate
    st = topo.load(a.name) or net.up(a.name, a.ranks, rate=a.rate)
    try:
        record["cluster"] = {k: st[k] for k in ("hosts", "rate", "mtu", "congestion")}
        record["link_MBps"] = [linkrate.measure(st, 1, 0) for _ in range(3)]
        link = statistics.median(record["link_MBps"])
        prefix = [sys.executable, "-m", "harp.cluster", "run", "--name", a.name, "--hosts", str(a.ranks),
                  "--timeout", str(a.timeout), "--"]
        reps = []
        for rep in range(a.repeat):
            reps.append(run_job(prefix, tmp, f"arena{rep}", a.iters, sizes, env, a.timeout + 60))
            record["stamp_rep" + str(rep)] = stamp()
        record["arena"] = {"runs": reps, "summary": summarise(reps, a.ranks, link)}
        print_table(f"64 tensors 4K-2M (32 MB) float32, {a.ranks} hosts x 1 rank, {a.rate}, link {link:.1f} MB/s",
                    record["arena"]["summary"])
    finally:
        net.down(st)


def local(a, tmp, env, sizes, record):
    launch = [os.path.join(os.path.dirname(sys.executable), "harp-run")]
    if not os.path.exists(launch[0]):
        launch = [sys.executable, "-m", "harp.launch"]
    reps = []
    for rep in range(a.repeat):
        reps.append(run_job(launch + ["-n", str(a.ranks)], tmp, f"local{rep}", a.iters, sizes, env, a.timeout))
        record["stamp_rep" + str(rep)] = stamp()
    record["local"] = {"runs": reps, "summary": summarise(reps, a.ranks, None)}
    print_table(f"64 tensors 4K-2M (32 MB) float32, {a.ranks} local ranks, loopback {env['HARP_TRANSPORT']}",
                record["local"]["summary"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--where", choices=["local", "arena"], default="local")
    ap.add_argument("--name", default="coal17")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="coalesced-bench-")
    env = dict(os.environ, PYTHONPATH=PYDIR, OMP_NUM_THREADS="1", HARP_TRANSPORT=a.transport)
    sizes = tensor_sizes()
    record = {"stamp_before": stamp(), "command": " ".join(sys.argv), "modes": MODES, "tensor_bytes": sizes,
              "total_bytes": sum(sizes)}
    (arena if a.where == "arena" else local)(a, tmp, env, sizes, record)
    record["stamp_after"] = stamp()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"# wrote {a.out}")


if __name__ == "__main__":
    main()
