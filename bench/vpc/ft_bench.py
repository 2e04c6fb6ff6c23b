"""Fault tolerance on the arena: lose rank(s) during a 64 MB allreduce, N trials.

    python3 bench/vpc/ft_bench.py --hosts 4 --ppn 2 --trials 100 --mode kill --out results/arena/ft.json

One arena job (--name, default ftbench; brought up and taken down here unless it exists) runs this file
as the worker on hosts x ppn ranks (harp launcher: the bootstrap store is the launcher's own process,
outside every host, so it outlives any rank). Per trial every rank draws the same victim(s) and a delay
in [0.05, 1) s into a loop of 64 MB float32 allreduces. --mode:
  kill  one random rank (never the current rank 0, the anchor that owns the replacements) SIGKILLs itself;
  stop  that rank SIGSTOPs itself (frozen: its sockets stay open; rank 0 SIGKILLs it after the recovery);
  cut   a random host other than rank 0's loses its link (its lowest rank sets eth0 down in its own
        namespace): all its ranks are lost at once; they exit on their error; rank 0 sets the link up
        again after the recovery.
Each survivor records: its error class and text, whether the text names the victim(s) ("rank V"), the
time from the loss to its error (detect), then revoke + agree + shrink (recover), a bit-exact allreduce of
integers on the survivors, and the grow back to the full size: rank 0 starts the replacement process(es)
in the lost ranks' host (nsenter into that host's namespaces), which join with ncclCommGrow's model
(grow on the survivors, a fresh unique id from rank 0), and every rank runs a bit-exact allreduce on the
grown communicator. grow_s = the last rank's end of that allreduce minus the last party's call (the
survivors' grow(), the joiners' Communicator()): the grow itself; regrow_s = the same end minus rank 0's
start of the replacement process (includes starting Python, importing numpy and harp).

Reports detect/recover/grow/regrow p50/p99/max and the named/exact counts; JSON stamped (stamp.py) with the
exact command and the load before and after. Keep-alive settings: HARP_KEEPALIVE_* as set;
HARP_TIMEOUT is set to 120 s so only the transports or the keep-alive explain an error.
--python DIR runs the ranks on another copy of the package (e.g. scripts/dev-build.sh's sanitizer
build, with LD_PRELOAD set by the caller).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "..", "python")
if os.environ.get("HARPFT_PYTHON"):
    PYDIR = os.environ["HARPFT_PYTHON"]
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


def _my_host():
    names = os.environ["HARPFT_HOSTNAMES"].split(",")
    return names.index(socket.gethostname())


def _host_map(comm):
    import numpy as np

    v = np.zeros(comm.size, np.int64)
    v[comm.rank] = _my_host()
    comm.allreduce(v)
    return [int(h) for h in v]


def _plan(comm, trial, seed, mode, hosts):
    """(victims, delay, cut host or None), the same on every rank."""
    rng = random.Random(seed * 100003 + trial)
    if mode == "cut":
        cand = sorted(set(hosts) - {hosts[0]})
        host, delay = rng.choice(cand), rng.uniform(0.05, 1.0)
        return [r for r in range(comm.size) if hosts[r] == host], delay, host
    victim, delay = rng.randrange(1, comm.size), rng.uniform(0.05, 1.0)
    return [victim], delay, None


def _lose(outdir, trial, mode, delay):
    def go():
        with open(os.path.join(outdir, f"kill-{trial}"), "w") as f:
            f.write(json.dumps({"t": time.time(), "pid": os.getpid()}))
        if mode == "cut":
            subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
        else:
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
    threading.Timer(delay, go).start()


def _restore(outdir, trial, mode, cut_host):
    """Rank 0, after the recovery: end the frozen victim, or bring the cut link back."""
    if mode == "stop":
        os.kill(json.load(open(os.path.join(outdir, f"kill-{trial}")))["pid"], signal.SIGKILL)
    elif mode == "cut":
        holder = os.environ["HARPFT_HOLDERS"].split(",")[cut_host]
        subprocess.run(["nsenter", "-t", holder, "-n", "ip", "link", "set", "eth0", "up"], check=True)


def _named(msg, r):
    return f"rank {r} " in msg or f"rank {r}:" in msg or f"rank {r})" in msg or f"rank {r}," in msg


def _spawn_joiners(ctx, uid, first_rank, host, trial):
    holder = os.environ["HARPFT_HOLDERS"].split(",")[host]
    ns = ["nsenter", "-t", holder, "-n", "-u", "-m", f"--wd={os.getcwd()}", "--"]
    for r in range(first_rank, ctx["full"]):
        ctx["joiners"].append(subprocess.Popen(ns + [sys.executable, os.path.abspath(__file__), "_join", uid.hex(),
                                                     str(r), str(ctx["full"]), str(trial), json.dumps(ctx["args"])]))


def _after_grow(big, trial, t_call, outdir, rec):
    rec.update(grow_call=t_call, grow_exact=_exact(big, trial), grow_ready=time.time())


def _trial(comm, trial, ctx):
    import numpy as np

    import harp

    a, outdir = ctx["args"], ctx["args"]["outdir"]
    hosts = _host_map(comm)
    victims, delay, cut_host = _plan(comm, trial, a["seed"], a["mode"], hosts)
    x = np.ones(N, np.float32)
    comm.barrier()
    if comm.rank == min(victims):
        _lose(outdir, trial, a["mode"], delay)
    try:
        while True:
            comm.allreduce(x)
    except harp.HarpError as e:
        t_err = time.time()
        err = (type(e).__name__, str(e))
    if comm.rank in victims:  # cut off (a killed or frozen victim never gets here)
        print(f"ft_bench: trial {trial}: rank {comm.rank} (pid {os.getpid()}) was cut off: {err[1][:200]}",
              file=sys.stderr, flush=True)
        os._exit(0)
    t0 = time.monotonic()
    comm.revoke()
    _, failed = comm.agree(True)
    new = comm.shrink(failed)
    recover = time.monotonic() - t0
    kill_file = os.path.join(outdir, f"kill-{trial}")
    t_kill = json.load(open(kill_file))["t"] if os.path.exists(kill_file) else None
    rec = {"trial": trial, "mode": a["mode"], "victims": victims, "old_rank": comm.rank, "err": err[0],
           "msg": err[1][:400], "named": all(_named(err[1], v) for v in victims),
           "named_any": any(_named(err[1], v) for v in victims),
           "detect_s": None if t_kill is None else t_err - t_kill, "recover_s": recover, "failed": failed,
           "exact": _exact(new, trial)}
    comm.destroy()
    # grow back: rank 0 makes the id and starts the replacements where the lost ranks were
    t_call = time.time()
    uid = harp.get_unique_id() if new.rank == 0 else None
    if uid is not None:
        _restore(outdir, trial, a["mode"], cut_host)
        rec["spawn_t"] = time.time()
        _spawn_joiners(ctx, uid, new.size, cut_host if cut_host is not None else hosts[victims[0]], trial + 1)
    big = new.grow(ctx["full"], uid)
    new.destroy()
    _after_grow(big, trial, t_call, outdir, rec)
    _log(outdir, rec)
    return big


def _loop(comm, first, ctx):
    for t in range(first, ctx["args"]["trials"]):
        comm = _trial(comm, t, ctx)
    comm.destroy()
    for p in ctx["joiners"]:
        p.wait()


def worker(args):
    import harp

    comm = harp.init()
    _loop(comm, 0, {"args": args, "full": comm.size, "joiners": []})


def joiner(uid_hex, rank, size, first, args):
    import harp

    t_call = time.time()
    comm = harp.Communicator(rank, size, harp.UniqueId.from_hex(uid_hex))
    rec = {"trial": first - 1, "joiner": True, "rank": rank}
    _after_grow(comm, first - 1, t_call, args["outdir"], rec)
    _log(args["outdir"], rec)
    _loop(comm, first, {"args": args, "full": size, "joiners": []})


# ---------------------------------------------------------------------------------------------- driver
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))] if v else None


def summarize(recs, trials, full):
    by_trial = {}
    for r in recs:
        by_trial.setdefault(r["trial"], {"surv": [], "join": []})["join" if r.get("joiner") else "surv"].append(r)
    done = {t: v for t, v in by_trial.items() if v["surv"] and len(v["surv"]) == full - len(v["surv"][0]["victims"])}
    summary = {
        "trials_done": len(done),
        "trials_all_named": sum(1 for v in done.values() if all(r["named"] for r in v["surv"])),
        "trials_any_named": sum(1 for v in done.values() if all(r["named_any"] for r in v["surv"])),
        "trials_all_exact": sum(1 for v in done.values() if all(r["exact"] for r in v["surv"])),
        "trials_grow_exact": sum(1 for v in done.values() if all(r.get("grow_exact") for r in v["surv"] + v["join"])),
        "survivor_errors": sum(len(v["surv"]) for v in done.values()),
        "survivor_errors_named": sum(sum(r["named"] for r in v["surv"]) for v in done.values()),
        "errors": sorted({r["err"] for v in done.values() for r in v["surv"]}),
    }
    series = {"detect_s": [], "recover_s": [], "grow_s": [], "regrow_s": []}
    for v in done.values():
        series["detect_s"] += [r["detect_s"] for r in v["surv"] if r.get("detect_s") is not None]
        series["recover_s"] += [r["recover_s"] for r in v["surv"]]
        parties = v["surv"] + v["join"]
        if v["join"] and all(r.get("grow_ready") for r in parties):
            end = max(r["grow_ready"] for r in parties)
            series["grow_s"].append(end - max(r["grow_call"] for r in parties))
            spawn = [r["spawn_t"] for r in v["surv"] if r.get("spawn_t")]
            if spawn:
                series["regrow_s"].append(end - spawn[0])
    for key, vals in series.items():
        summary[key] = {"n": len(vals), "p50": pct(vals, 50), "p99": pct(vals, 99), "max": max(vals) if vals else None}
    return summary


def main():
    from harp_dev.cluster import net, runner, topology as topo
    from stamp import stamp

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="ftbench")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ppn", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mode", choices=["kill", "stop", "cut"], default="kill")
    ap.add_argument("--timeout", type=int, default=3000)
    ap.add_argument("--python", default=PYDIR, help="package directory the ranks import harp from")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.mode == "cut" and a.hosts < 2:
        ap.error("--mode cut needs at least 2 hosts")
    st = topo.load(a.name)
    made = st is None
    if made:
        st = net.up(a.name, a.hosts, rate=a.rate)
    outdir = tempfile.mkdtemp(prefix="ftbench-", dir="/tmp")
    record = {"command": " ".join(sys.argv), "stamp_before": stamp(),
              "keepalive": {k: os.environ.get(k) for k in ("HARP_KEEPALIVE_INTERVAL", "HARP_KEEPALIVE_TIMEOUT")},
              "cluster": {k: st[k] for k in ("hosts", "rate", "mtu", "congestion")}}
    args = {"trials": a.trials, "seed": a.seed, "mode": a.mode, "outdir": outdir}
    try:
        pydir = os.path.abspath(a.python)
        env = dict(os.environ, PYTHONPATH=pydir, HARPFT_PYTHON=pydir, HARP_TIMEOUT="120", OMP_NUM_THREADS="1",
                   PYTHONFAULTHANDLER="1",
                   HARPFT_HOLDERS=",".join(str(h) for h in st["holders"]),
                   HARPFT_HOSTNAMES=",".join(topo.hostname(a.name, i) for i in range(st["hosts"])))
        t0 = time.monotonic()
        rc = runner.run(st, "harp", a.hosts, a.ppn, [sys.executable, os.path.abspath(__file__), "_worker",
                                                     json.dumps(args)],
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
    summary = summarize(recs, a.trials, a.hosts * a.ppn)
    record["summary"] = summary
    record["stamp_after"] = stamp()
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(summary, indent=1))
    # the job's status is the first victim's (137: SIGKILL); complete records are the success criterion
    return 0 if summary["trials_done"] == a.trials else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker(json.loads(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_join":
        joiner(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6]))
    else:
        sys.exit(main())
