"""CPU time per call of a one-rank collective through the Python binding, two checkouts ABBA.

    python3 bench/percall_cpu.py BEFORE_ROOT AFTER_ROOT [--reps 8] [--calls 100000] [--colls allreduce,broadcast]
    python3 bench/percall_cpu.py BEFORE_ROOT AFTER_ROOT --callgrind [--calls 10000]

A one-rank communicator runs the whole call path (argument checks, selection, descriptor and
tag, Context, recorder, closing check, finish) with no peer to wait for, so what a call costs
is CPU work alone. Each run is a fresh process on one checkout (PYTHONPATH=ROOT/python) that
times `calls` 8-byte calls after 2000 warm-up calls and reports process CPU time per call
(time.process_time: the time it waited for a core does not count, which keeps a loaded
machine's figures usable) and wall time per call. The side that runs first alternates by
repetition. Prints one line per run, then per collective the median over repetitions of each
side and after/before. --callgrind instead runs each side once under valgrind's callgrind,
counting the instructions executed inside Communicator::run (inclusive) over the warm-up and
timed calls: a count that machine load cannot move.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

CHILD = """
import sys, time
import numpy as np
import harp
coll, n = sys.argv[1], int(sys.argv[2])
c = harp.Communicator(0, 1, harp.get_unique_id())
x = np.ones(2, np.float32)
f = c.allreduce if coll == "allreduce" else (lambda b: c.broadcast(b, root=0))
for _ in range(2000):
    f(x)
t0, w0 = time.process_time(), time.perf_counter()
for _ in range(n):
    f(x)
print(round((time.process_time() - t0) / n * 1e9, 1), round((time.perf_counter() - w0) / n * 1e9, 1))
c.destroy()
"""


def run(root, coll, calls):
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
    out = subprocess.run([sys.executable, "-c", CHILD, coll, str(calls)], capture_output=True, text=True, env=env,
                         cwd=root, timeout=600, check=True).stdout.split()
    return float(out[0]), float(out[1])


def instructions(root, coll, calls):
    """Instructions per call inside Communicator::run, from callgrind."""
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"percall-{os.getpid()}.callgrind")
    p = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                        "--toggle-collect=harp::Communicator::run(harp::CollArgs)", f"--callgrind-out-file={out}",
                        sys.executable, "-c", CHILD, coll, str(calls)], capture_output=True, text=True, env=env,
                       cwd=root, timeout=1800, check=True)
    os.unlink(out)
    return int(re.search(r"Collected : (\d+)", p.stderr).group(1)) / (calls + 2000)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--colls", default="allreduce,broadcast")
    ap.add_argument("--callgrind", action="store_true", help="count instructions (valgrind) instead of timing")
    a = ap.parse_args()
    if a.callgrind:
        for coll in a.colls.split(","):
            b, f = instructions(a.before, coll, a.calls), instructions(a.after, coll, a.calls)
            print(f"{coll}: instructions a call in Communicator::run, before {b:.1f}, after {f:.1f}, "
                  f"after/before {f / b:.4f}", flush=True)
        return
    res = {}
    for rep in range(1, a.reps + 1):
        for coll in a.colls.split(","):
            for side in (("before", "after") if rep % 2 else ("after", "before")):
                cpu, wall = run(getattr(a, side), coll, a.calls)
                res.setdefault((coll, side), []).append((cpu, wall))
                load = open("/proc/loadavg").read().split()[0]
                print(f"rep {rep} {coll} {side}: cpu {cpu} ns/call, wall {wall} ns/call, load {load}", flush=True)
    for coll in a.colls.split(","):
        b = [c for c, _ in res[(coll, "before")]]
        f = [c for c, _ in res[(coll, "after")]]
        mb, ma = statistics.median(b), statistics.median(f)
        print(f"{coll}: cpu ns/call median before {mb:.1f} ({min(b):.1f}-{max(b):.1f}), after {ma:.1f} "
              f"({min(f):.1f}-{max(f):.1f}), after/before {ma / mb:.3f}")


if __name__ == "__main__":
    main()
