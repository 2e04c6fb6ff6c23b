"""Back-to-back small broadcasts, each rank's own time per call, trees alternating in one session.

harp-bench reports the mean over ranks (as nccl-tests does); this shows every rank's figure, so a
root that runs ahead of its receivers (or is held back by them) is visible.

    python3 bench/bcast_per_rank.py --trees BEFORE_ROOT AFTER_ROOT [--np 3] [--transport tcp]
        [--iters 20000] [--reps 5] [--json OUT.json]

Each tree is a checkout built with scripts/dev-build.sh; a rep runs every tree once (the order
alternates by rep). Per run and rank: microseconds per call over `iters` 8-byte broadcasts from
rank 0, after 1000 warm-up calls and a barrier. The JSON is stamped (commit, CPU, cores, load, time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

BODY = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
import numpy as np
import harness

def body(rank, size, n):
    import harp
    c = harp.init(timeout=60)
    x = np.ones(2, np.float32)
    for _ in range(1000):
        c.broadcast(x, root=0)
    c.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        c.broadcast(x, root=0)
    t = (time.perf_counter() - t0) / n * 1e6
    c.destroy()
    return t

print(json.dumps(harness.run_ranks(int(sys.argv[2]), body, int(sys.argv[3]),
                                   env={"HARP_TRANSPORT": sys.argv[4]}, timeout=300)))
"""


def run(tree, a):
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "python"))
    r = subprocess.run([sys.executable, "-c", BODY, os.path.join(tree, "tests"), str(a.np), str(a.iters),
                        a.transport], capture_output=True, text=True, env=env, cwd=tree, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{tree}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs="+", required=True)
    p.add_argument("--np", type=int, default=3)
    p.add_argument("--transport", default="tcp")
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    trees = [os.path.abspath(t) for t in a.trees]
    out = {t: [] for t in trees}
    for rep in range(a.reps):
        for t in (trees if rep % 2 == 0 else trees[::-1]):
            us = run(t, a)
            out[t].append(us)
            print(f"rep {rep + 1} {os.path.basename(t)}: " + " ".join(f"{u:.2f}" for u in us) + " us/call by rank",
                  flush=True)
    for t in trees:
        per_rank = list(zip(*out[t]))
        print(f"{os.path.basename(t)}: median by rank " +
              " ".join(f"{statistics.median(r):.1f} ({min(r):.1f}-{max(r):.1f})" for r in per_rank))
    if a.json:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        from harp_dev.bench.stamp import stamp
        with open(a.json, "w") as f:
            json.dump({"stamp": stamp(sys.argv, a.transport, ["broadcast"]), "np": a.np, "iters": a.iters,
                       "runs": {t: out[t] for t in trees}}, f, indent=1)


if __name__ == "__main__":
    main()
