"""Back-to-back 8-byte broadcasts (or allreduces): each rank's wall time AND CPU time per call.

CPU time (getrusage of the calling thread, user + system) moves far less with the machine's load
than wall time does, so on a shared 2-core machine it compares trees where wall figures are noise.

    python3 bench/bcast_cpu_per_call.py TREE[,TREE...] NP TRANSPORT REPS [ENV_JSON] [COLL]

Each tree is a checkout built with scripts/dev-build.sh; a rep runs every tree once (the order
alternates by rep). Per run and rank: [wall us/call, CPU us/call, user-CPU us/call, voluntary and
involuntary context switches per 1000 calls] over 20,000 calls after 1,000 warm-up calls and a
barrier. ENV_JSON: extra environment for the ranks (e.g. '{"HARP_CHECK_WINDOW": "64"}').
COLL: broadcast (default, root 0) or allreduce.
"""
import json
import os
import subprocess
import sys

BODY = r"""
import sys, time, json, resource
sys.path.insert(0, sys.argv[1])
import numpy as np
import harness
def body(rank, size, n, coll):
    import harp
    c = harp.init(timeout=60)
    x = np.ones(2, np.float32)
    call = (lambda: c.broadcast(x, root=0)) if coll == "broadcast" else (lambda: c.allreduce(x))
    for _ in range(1000):
        call()
    c.barrier()
    r0 = resource.getrusage(resource.RUSAGE_THREAD); t0 = time.perf_counter()
    for _ in range(n):
        call()
    t = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_THREAD)
    c.destroy()
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    user = r1.ru_utime - r0.ru_utime
    return [round(t / n * 1e6, 2), round(cpu / n * 1e6, 2), round(user / n * 1e6, 2),
            round((r1.ru_nvcsw - r0.ru_nvcsw) / n * 1000, 1), round((r1.ru_nivcsw - r0.ru_nivcsw) / n * 1000, 1)]
env = {"HARP_TRANSPORT": sys.argv[4]}
env.update(json.loads(sys.argv[5]))
print(json.dumps(harness.run_ranks(int(sys.argv[2]), body, int(sys.argv[3]), sys.argv[6], env=env, timeout=300)))
"""


def run(tree, np_, iters, tp, extra, coll):
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "python"))
    r = subprocess.run([sys.executable, "-c", BODY, os.path.join(tree, "tests"), str(np_), str(iters), tp, extra, coll],
                       capture_output=True, text=True, env=env, cwd=tree, timeout=600)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    trees = sys.argv[1].split(",")
    np_, tp, reps = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    extra = sys.argv[5] if len(sys.argv) > 5 else "{}"
    coll = sys.argv[6] if len(sys.argv) > 6 else "broadcast"
    for rep in range(reps):
        for t in (trees if rep % 2 == 0 else trees[::-1]):
            res = run(t, np_, 20000, tp, extra, coll)
            load = open("/proc/loadavg").read().split()[0]
            print(os.path.basename(t), coll, np_, tp, "load", load, "ranks [wall, cpu, user, vcsw/k, ivcsw/k]:", res,
                  flush=True)


if __name__ == "__main__":
    main()
