"""Fault tolerance on the arena (issue 18): kill -9 a random rank during a 64 MB allreduce, N trials.

    python3 bench/vpc/ft_bench.py --hosts 4 --ppn 2 --trials 100 --out bench/vpc/results/ft.json

One arena job (--name, default ftbench; brought up and taken down here unless it exists) runs this file
as the worker on hosts x ppn ranks (harp launcher: the bootstrap store is the launcher's own process,
outside every host, so it outlives any rank). Per trial, every rank draws the same victim (never the
current rank 0, the anchor that owns the replacements) and a delay in [0.05, 1) s; all ranks loop on a
64 MB float32 allreduce; the victim records the wall-clock time and SIGKILLs itself after the delay.
Each survivor records: its error class and text, whether the text names the victim ("rank V"), the
time from the kill to its error (detect), then revoke + agree + shrink (recover), a bit-exact
allreduce of integers on the survivors, and the time of the grow back to the full size (grow): rank 0
starts a replacement process (in host 0's namespace: the arena gives a rank no way into another host)
that joins with ncclCommGrow's model (grow on the survivors, a fresh unique id from rank 0).

Reports detect/recover/grow p50/p99/max and the named/exact counts; JSON stamped (stamp.py) with the
exact command and the load before and after. Keep-alive settings: HARP_KEEPALIVE_* as set (defaults
1 s / 3 s); HARP_TIMEOUT is set to 120 s so only the transports or the keep-alive explain an error.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "..", "python")
sys.path.insert(0, os.path.abspath(PYDIR))
sys.path.insert(0, HERE)

N = 16 << 20  # float32 elements: 64 MB


# ---------------------------------------------------------------------------------------------- worker
def _log(outdir, rec):
    with open(os.path.join(outdir, f"rec-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


def _exact(comm, trial):
    import numpy as np

    x = np.full(1 << 16, float((comm.rank + 1) * (trial + 1)), np.float32)
    comm.allreduce(x)
    want = float(sum((r + 1) * (trial + 1) for r in range(comm.size)))
    return bool(np.all(x == want))


def _trial(comm, trial, trials, seed, outdir, full_size, joiners):
    import numpy as np

    import harp

    rng = random.Random(seed * 100003 + trial)
    victim, delay = rng.randrange(1, comm.size), rng.uniform(0.05, 1.0)
    x = np.ones(N, np.float32)
    comm.barrier()
    if comm.rank == victim:
        def die():
            with open(os.path.join(outdir, f"kill-{trial}"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(delay, die).start()
    try:
        while True:
            comm.allreduce(x)
    except harp.HarpError as e:
        t_err = time.time()
        err = (type(e).__name__, str(e))
    t0 = time.monotonic()
    comm.revoke()
    _, failed = comm.agree(True)
    new = comm.shrink(failed)
    recover = time.monotonic() - t0
    kill_file = os.path.join(outdir, f"kill-{trial}")
    t_kill = float(open(kill_file).read()) if os.path.exists(kill_file) else None
    rec = {"trial": trial, "victim": victim, "old_rank": comm.rank, "err": err[0], "msg": err[1][:300],
           "named": f"rank {victim} " in err[1] or f"rank {victim}:" in err[1] or f"rank {victim})" in err[1],
           "detect_s": None if t_kill is None else t_err - t_kill, "recover_s": recover, "failed": failed,
           "exact": _exact(new, trial)}
    comm.destroy()
    # grow back: rank 0 makes the id and starts the replacement, which joins as the last rank
    t1 = time.monotonic()
    uid = harp.get_unique_id() if new.rank == 0 else None
    if uid is not None:
        joiners.append(subprocess.Popen([sys.executable, __file__, "_join", uid.hex(), str(full_size - 1),
                                         str(full_size), str(trial + 1), str(trials), str(seed), outdir]))
    big = new.grow(full_size, uid)
    rec["grow_s"] = time.monotonic() - t1
    new.destroy()
    _log(outdir, rec)
    return big


def _loop(comm, first, trials, seed, outdir):
    full, joiners = comm.size, []
    for t in range(first, trials):
        comm = _trial(comm, t, trials, seed, outdir, full, joiners)
    comm.destroy()
    for p in joiners:
        p.wait()


def worker(trials, seed, outdir):
    import harp

    _loop(harp.init(), 0, trials, seed, outdir)


def joiner(uid_hex, rank, size, first, trials, seed, outdir):
    import harp

    comm = harp.Communicator(rank, size, harp.UniqueId.from_hex(uid_hex))
    _loop(comm, first, trials, seed, outdir)


# ---------------------------------------------------------------------------------------------- driver
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))] if v else None


def main():
    from harp.cluster import net, runner, topology as topo
    from stamp import stamp

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="ftbench")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ppn", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=3000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    st = topo.load(a.name)
    made = st is None
    if made:
        st = net.up(a.name, a.hosts, rate=a.rate)
    outdir = tempfile.mkdtemp(prefix="ftbench-", dir="/tmp")
    record = {"command": " ".join(sys.argv), "stamp_before": stamp(),
              "cluster": {k: st[k] for k in ("hosts", "rate", "mtu", "congestion")}}
    try:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(PYDIR), HARP_TIMEOUT="120", OMP_NUM_THREADS="1")
        t0 = time.monotonic()
        rc = runner.run(st, "harp", a.hosts, a.ppn, [sys.executable, os.path.abspath(__file__), "_worker",
                                                     str(a.trials), str(a.seed), outdir],
                        timeout=a.timeout, grace=1e9, env=env)
        record["job_rc"], record["job_s"] = rc, time.monotonic() - t0
    finally:
        if made:
            net.down(st)
    recs = []
    for fn in os.listdir(outdir):
        if fn.startswith("rec-"):
            recs += [json.loads(line) for line in open(os.path.join(outdir, fn))]
    record["records"] = recs
    by_trial = {}
    for r in recs:
        by_trial.setdefault(r["trial"], []).append(r)
    full = a.hosts * a.ppn
    summary = {
        "trials_done": len(by_trial),
        "trials_all_named": sum(1 for v in by_trial.values() if len(v) == full - 1 and all(r["named"] for r in v)),
        "trials_all_exact": sum(1 for v in by_trial.values() if len(v) == full - 1 and all(r["exact"] for r in v)),
        "errors": sorted({r["err"] for r in recs}),
    }
    for key in ("detect_s", "recover_s", "grow_s"):
        vals = [r[key] for r in recs if r.get(key) is not None]
        summary[key] = {"n": len(vals), "p50": pct(vals, 50), "p99": pct(vals, 99), "max": max(vals) if vals else None}
    record["summary"] = summary
    record["stamp_after"] = stamp()
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(summary, indent=1))
    # the job's status is the first victim's (137: SIGKILL); complete records are the success criterion
    return 0 if summary["trials_done"] == a.trials else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) > 1 and sys.argv[1] == "_join":
        joiner(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
               int(sys.argv[7]), sys.argv[8])
    else:
        sys.exit(main())
