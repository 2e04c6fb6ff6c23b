"""The job view at scale: how long `harp-status --job` takes for n ranks on one host while they hang in an
allreduce, and what the view costs an idle job (CPU time of every rank's observer thread over an idle window).

    python3 bench/jobview_bench.py --ranks 256 --transport tcp --idle 60 --out results/observe/jobview-256.json

One harp-run job (bench/scale_bench.py's launcher). Every rank inits and reports ready; then every rank but the
last enters an allreduce that the last rank joins only after --hang seconds (a hang the view must see through:
the last rank is idle, the others in flight). Meanwhile harp-status --job --json runs --views times (from the
host's status sockets, a private HARP_STATUS_DIR); recorded: the command's wall time (interpreter start
included) and the view's own time (the tool's "seconds": handshake + tree + answer), and whether every rank
answered with the right in-flight state. Then every rank sleeps outside collectives: the CPU time
(/proc/<pid>/task/<tid>/schedstat) of each process's harp-observer thread (which serves the job view) and, for
comparison, its harp-publisher thread (the coarse clock, older than the job view) over --idle seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.abspath(os.path.join(HERE, "..", "python"))

WORKER = r'''
import json, os, sys, time
import numpy as np
import harp

d = sys.argv[1]
comm = harp.init(timeout=900)
open(os.path.join(d, f"ready.{comm.rank}"), "w").close()
while not os.path.exists(os.path.join(d, "phase")):
    time.sleep(0.2)
ph = json.load(open(os.path.join(d, "phase")))
x = np.ones(64, np.float32)
if comm.rank == comm.size - 1:
    time.sleep(max(0.0, ph["hang_end"] - time.time()))
comm.allreduce(x)
time.sleep(max(0.0, ph["idle_end"] - time.time()))
comm.barrier()
'''


def thread_cpu_ns(pid, name):
    """Nanoseconds on CPU of the thread of pid named `name` (schedstat), or None."""
    base = f"/proc/{pid}/task"
    try:
        for tid in os.listdir(base):
            with open(f"{base}/{tid}/comm") as f:
                if f.read().strip() == name:
                    with open(f"{base}/{tid}/schedstat") as g:
                        return int(g.read().split()[0])
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--views", type=int, default=5)
    ap.add_argument("--hang", type=float, default=30.0, help="seconds the last rank keeps the others waiting")
    ap.add_argument("--idle", type=float, default=60.0, help="seconds of the idle-cost window")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="harp-jobview-bench-")
    sdir = os.path.join(tmp, "status")
    os.mkdir(sdir, 0o700)
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    env = dict(os.environ, PYTHONPATH=PYDIR, OMP_NUM_THREADS="1", HARP_TRANSPORT=a.transport, HARP_STATUS_DIR=sdir,
               HARP_STALL_WARNING_S="900")
    n = a.ranks
    t0 = time.time()
    job = subprocess.Popen([sys.executable, "-m", "harp.launch", "-n", str(n), sys.executable, worker, tmp],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while sum(1 for x in os.listdir(tmp) if x.startswith("ready.")) < n:
        if job.poll() is not None:
            raise RuntimeError(f"the job ended ({job.returncode}): {job.stderr.read()[-2000:]}")
        time.sleep(0.5)
    init_s = time.time() - t0
    start = time.time() + 2
    phase = {"hang_end": start + a.hang, "idle_end": start + a.hang + 5 + a.idle + 5}
    with open(os.path.join(tmp, "phase.tmp"), "w") as f:
        json.dump(phase, f)
    os.rename(os.path.join(tmp, "phase.tmp"), os.path.join(tmp, "phase"))
    time.sleep(4)  # every rank but the last inside the allreduce
    views = []
    for _ in range(a.views):
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "harp.status", "--job", "--json"], capture_output=True, text=True,
                           env=env, timeout=60)
        wall = time.monotonic() - t
        v = json.loads(r.stdout)["comms"][0]
        ok = [e for e in v["ranks"] if e["state"] == "ok"]
        flight = sum(1 for e in ok if e["in_flight"])
        links = {k: sum(g.get(k, 0) for e in ok for g in e.get("links", [])) for k in ("up", "not_connected", "failed")}
        views.append({"wall_s": round(wall, 3), "view_s": v["seconds"], "ranks_ok": len(ok), "in_flight": flight,
                      "blame": v["analysis"]["blame"][:4], "answer_bytes": len(r.stdout), "links": links})
        print(f"view: command {wall:.3f} s, view {v['seconds']:.3f} s, {len(ok)}/{n} ranks answered, {flight} in "
              f"flight, to blame {v['analysis']['blame'][:4]}, tcp pairs over all ranks {links}", flush=True)
    pids = [int(x.split(".")[0]) for x in os.listdir(sdir) if x.endswith(".sock")]
    time.sleep(max(0.0, phase["hang_end"] + 5 - time.time()))
    before = {p: (thread_cpu_ns(p, "harp-observer"), thread_cpu_ns(p, "harp-publisher")) for p in pids}
    t = time.monotonic()
    time.sleep(a.idle)
    span = time.monotonic() - t
    after = {p: (thread_cpu_ns(p, "harp-observer"), thread_cpu_ns(p, "harp-publisher")) for p in pids}
    obs = [(after[p][0] - before[p][0]) / 1e9 / span * 100 for p in pids if before[p][0] is not None and after[p][0]]
    pub = [(after[p][1] - before[p][1]) / 1e9 / span * 100 for p in pids if before[p][1] is not None and after[p][1]]
    idle = {"window_s": round(span, 2), "processes": len(obs),
            "observer_pct_of_core_max": max(obs), "observer_pct_of_core_mean": sum(obs) / len(obs),
            "publisher_pct_of_core_max": max(pub), "publisher_pct_of_core_mean": sum(pub) / len(pub)}
    print(f"idle {span:.1f} s, {len(obs)} processes: observer thread max {idle['observer_pct_of_core_max']:.4f}% "
          f"mean {idle['observer_pct_of_core_mean']:.4f}% of a core; publisher thread (the coarse clock) max "
          f"{idle['publisher_pct_of_core_max']:.4f}% mean {idle['publisher_pct_of_core_mean']:.4f}%", flush=True)
    job.wait(timeout=300)
    rec = {"ranks": n, "transport": a.transport, "init_s": round(init_s, 1), "views": views, "idle": idle,
           "job_rc": job.returncode}
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
