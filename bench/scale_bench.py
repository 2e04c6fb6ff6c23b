"""Many ranks on one host: init time, file descriptors and memory per rank, and a correct
allreduce of every flat algorithm, a split, a shrink after one rank is killed and a destroy, at 16 .. 256 ranks (processes on the
shared cores of this machine: no bandwidth claims).

    python3 bench/scale_bench.py --ranks 16,64,128,256 --transport tcp --out results/scale/scale-tcp.json

Per rank count, one harp-run job; every rank records: the time from its call of harp.init()
to the return (the job's init time is the last return minus the last call: the rendezvous and
connection set-up once every rank has arrived, not the interpreters' start), open file
descriptors and RSS after init and after the collectives (/proc/self), and for each algorithm an
allreduce of --count float32 elements checked against the exact sum; then split by rank parity
(an allreduce on each half, checked); the last rank SIGKILLs itself and the others shrink past it
(an allreduce on the survivors, checked); destroy. Rank 0's and the maxima over ranks are
reported. One JSON, stamped (bench/vpc/stamp.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.abspath(os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "vpc"))
from stamp import stamp, write_record  # noqa: E402

WORKER = r'''
import json, os, signal, sys, time
import numpy as np
import harp

out, count, algos = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")

def fds():
    return len(os.listdir("/proc/self/fd"))

def rss_kb(field="VmRSS"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0

rec = {"fds_before_init": fds(), "rss_kb_before_init": rss_kb()}
rec["init_called"] = time.time()
comm = harp.init(timeout=900)
rec["init_returned"] = time.time()
rank, size = comm.rank, comm.size
rec.update(rank=rank, size=size, fds_after_init=fds(), rss_kb_after_init=rss_kb())
want = size * (size + 1) / 2
rec["algos"] = {}
for algo in algos:
    x = np.full(count, rank + 1, np.float32)
    comm.barrier()
    t = time.perf_counter()
    comm.allreduce(x, algo=algo)
    dt = time.perf_counter() - t
    rec["algos"][algo] = {"s": dt, "ok": bool(np.all(x == want))}
    rec[f"fds_after_{algo}"] = fds()
half = comm.split(rank % 2)
y = np.full(count, rank + 1, np.float32)
half.allreduce(y)
mine = [r + 1 for r in range(size) if r % 2 == rank % 2]
rec["split_ok"] = bool(np.all(y == sum(mine)))
half.destroy()
# A lost rank: the last one kills itself (SIGKILL, no goodbye); the others shrink past it.
victim = size - 1
rec["victim"] = rank == victim
if rank == victim and size > 1:
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(rec, f)
    os.kill(os.getpid(), signal.SIGKILL)
if size > 1:
    t = time.time()
    small = comm.shrink([victim])
    rec["shrink_s"] = time.time() - t
    z = np.full(count, rank + 1, np.float32)
    small.allreduce(z)
    rec["shrink_ok"] = bool(small.size == size - 1 and np.all(z == want - size))
    small.destroy()
rec.update(fds_end=fds(), rss_kb_end=rss_kb(), rss_kb_peak=rss_kb("VmHWM"))
t = time.time()
try:
    comm.destroy()
except harp.HarpError as e:  # the communicator that lost a rank
    rec["destroy_error"] = str(e)[:300]
rec["destroy_s"] = time.time() - t
with open(f"{out}.rank{rank}", "w") as f:
    json.dump(rec, f)
'''


def run(n, a, tmp):
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    out = os.path.join(tmp, f"r{n}")
    env = dict(os.environ, PYTHONPATH=PYDIR, OMP_NUM_THREADS="1", HARP_TRANSPORT=a.transport)
    # the rank that kills itself must not stop the others (harp-run's grace)
    launch = [sys.executable, "-m", "harp.launch", "--grace", str(a.timeout), "-n", str(n)]
    t = time.time()
    r = subprocess.run(launch + [sys.executable, worker, out, str(a.count), a.algos], capture_output=True, text=True,
                       env=env, timeout=a.timeout)
    wall = time.time() - t
    if r.returncode not in (0, 128 + 9):  # 137: the victim's SIGKILL, as harp-run reports it
        raise RuntimeError(f"{n} ranks failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-3000:]}")
    recs = [json.load(open(f"{out}.rank{i}")) for i in range(n)]
    init = max(x["init_returned"] for x in recs) - max(x["init_called"] for x in recs)
    wrong = [(x["rank"], k) for x in recs for k, v in x["algos"].items() if not v["ok"]]
    wrong += [(x["rank"], "split") for x in recs if not x["split_ok"]]
    survivors = [x for x in recs if not x.get("victim")]
    wrong += [(x["rank"], "shrink") for x in survivors if n > 1 and not x.get("shrink_ok")]
    summ = {"ranks": n, "job_wall_s": wall, "init_s": init,
            "init_s_per_rank_max": max(x["init_returned"] - x["init_called"] for x in recs),
            "fds_after_init_max": max(x["fds_after_init"] - x["fds_before_init"] for x in recs),
            "fds_end_max": max(x["fds_end"] - x["fds_before_init"] for x in survivors),
            "rss_mb_after_init_median": statistics.median(x["rss_kb_after_init"] for x in recs) / 1024,
            "rss_mb_harp_init_max": max(x["rss_kb_after_init"] - x["rss_kb_before_init"] for x in recs) / 1024,
            "rss_mb_peak_max": max(x["rss_kb_peak"] for x in survivors) / 1024,
            "allreduce_s_max": {k: max(x["algos"][k]["s"] for x in recs) for k in recs[0]["algos"]},
            "shrink_s_max": max((x.get("shrink_s", 0) for x in survivors), default=0),
            "destroy_s_max": max(x.get("destroy_s", 0) for x in survivors),
            "destroy_errors": sorted({x["destroy_error"] for x in survivors if x.get("destroy_error")})[:3],
            "wrong": wrong}
    print(f"{n:>5} ranks: init {init:6.2f} s (a rank's longest {summ['init_s_per_rank_max']:.2f} s), fds +"
          f"{summ['fds_after_init_max']} after init, +{summ['fds_end_max']} at the end; RSS median "
          f"{summ['rss_mb_after_init_median']:.0f} MB (init added {summ['rss_mb_harp_init_max']:.1f} MB at most), "
          f"peak {summ['rss_mb_peak_max']:.0f} MB; allreduce s " +
          ", ".join(f"{k} {v:.3f}" for k, v in summ["allreduce_s_max"].items()) +
          f"; shrink after a kill {summ['shrink_s_max']:.2f} s; wrong {wrong or 'none'}; job {wall:.0f} s", flush=True)
    return {"summary": summ, "ranks": recs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="16,64,128,256")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--algos", default="ring,recursive_doubling,halving_doubling,tree")
    ap.add_argument("--count", type=int, default=4099, help="float32 elements per allreduce (odd on purpose)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="scale-bench-")
    record = {"stamp_before": stamp(), "command": " ".join(sys.argv), "by_ranks": {}}
    for n in [int(x) for x in a.ranks.split(",")]:
        record["by_ranks"][n] = run(n, a, tmp)
        record["stamp_" + str(n)] = stamp()
    write_record(a.out, record)


if __name__ == "__main__":
    main()
