"""Start a job on an arena cluster, watch it, and leave nothing behind.

    rc = runner.run(st, "harp", hosts=3, ppn=1, cmd=["python", "x.py"], timeout=300)

Every process of the job (launcher agents, ranks, orteds, the harp store
server) carries HARP_CLUSTER_JOB=<job id> in its environment; when the job
ends, fails, times out, or this process gets SIGINT/SIGTERM, every process
with that tag is killed. A detached reaper (`harp-cluster _reap`) does the
same if this process is SIGKILLed, and also takes an ephemeral cluster down.
If a process exits non-zero, the others get `grace` seconds to finish, then
are killed; the job's status is the first failing one (128+signal if killed).
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

from . import launchers
from . import net
from . import slurm
from . import topology as topo

JOB_VAR = "HARP_CLUSTER_JOB"


def nsenter(holder_pid):
    return ["nsenter", "-t", str(holder_pid), "-n", "-u", "-m", f"--wd={os.getcwd()}", "--"]


def tagged_pids(job):
    """Processes whose environment carries HARP_CLUSTER_JOB=job."""
    needle = f"{JOB_VAR}={job}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(d))
        except OSError:
            continue
    return out


def kill_job(job, grace=1.0):
    pids = tagged_pids(job)
    net._signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(net._alive(p) for p in pids):
        time.sleep(0.05)
    net._signal_all(tagged_pids(job), signal.SIGKILL)


def start_reaper(job, down_name=None):
    argv = [sys.executable, "-m", "harp_dev.cluster", "_reap", "--pid", str(os.getpid()), "--job", job]
    if down_name:
        argv += ["--down", down_name]
    env = {k: v for k, v in os.environ.items() if k != JOB_VAR}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def reap(pid, job, down_name=None):
    """Body of `harp-cluster _reap`: wait for pid to die, then kill the job (and down the cluster)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while net._alive(pid):
        time.sleep(0.25)
    kill_job(job)
    if down_name:
        st = topo.load(down_name)
        if st and st.get("owner_pid") == pid:
            net.down(st)


def _store_server(st, env):
    """A harp store served from host 0 (the harp launcher's HARP_UNIQUE_ID); returns (proc, uid hex)."""
    code = ("import sys, harp; u = harp.get_unique_id(sys.argv[1]); print(u.hex(), flush=True); "
            "sys.stdin.read()")
    bind = f"{topo.address(st['slot'], 0)}:0"
    p = subprocess.Popen(nsenter(st["holders"][0]) + [sys.executable, "-c", code, bind], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = p.stdout.readline().strip()
    if not line:
        p.kill()
        raise RuntimeError("harp-cluster: the harp store server on host 0 did not start")
    return p, line


def _watch(procs, whats, timeout, grace, daemons=()):
    """Exit status of the job: the first non-zero status, once every process that is not a daemon
    (a service such as a Ray node, in `daemons`) has ended; a daemon that ends early fails the job."""
    status, failed_at, start = 0, None, time.monotonic()
    while True:
        alive = 0
        for p, what in zip(procs, whats):
            rc = p.poll()
            if rc is None:
                alive += p not in daemons
            elif p in daemons and status == 0:
                status, failed_at = (rc if rc > 0 else 128 - rc) or 1, time.monotonic()
                print(f"harp-cluster: {what} ended with status {rc} while the job ran", file=sys.stderr, flush=True)
            elif rc != 0 and status == 0:
                status, failed_at = (rc if rc > 0 else 128 - rc), time.monotonic()
                print(f"harp-cluster: {what} exited with status {rc}", file=sys.stderr, flush=True)
        if alive == 0:
            return status
        now = time.monotonic()
        if failed_at is not None and now - failed_at > grace:
            return status
        if timeout and now - start > timeout:
            print(f"harp-cluster: job ran past --timeout {timeout:g} s; stopping it", file=sys.stderr, flush=True)
            return 124
        time.sleep(0.05)


def run(st, launcher, hosts, ppn, cmd, timeout=None, grace=5.0, env=None, reaper=True):
    """Run cmd as hosts x ppn ranks through `launcher`; returns the job's exit status."""
    if not 1 <= hosts <= st["hosts"]:
        raise ValueError(f"--hosts {hosts}: cluster '{st['name']}' has {st['hosts']} hosts")
    if ppn < 1:
        raise ValueError("--ppn must be >= 1")
    job = secrets.token_hex(8)
    base = dict(os.environ if env is None else env)
    base[JOB_VAR] = job
    base.setdefault("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    if reaper:
        start_reaper(job, st["name"] if st.get("owner_pid") == os.getpid() else None)
    old = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    procs = []
    slurm_dir = None
    try:
        uid = None
        if launcher == "harp":
            server, uid = _store_server(st, base)
            procs.append(server)
        elif launcher == "slurm":
            slurm_dir = slurm.job_dir(st, job)
            slurm.start(st, hosts, ppn, base, job, nsenter)
        specs = launchers.plan(st, launcher, hosts, ppn, cmd, base, job, uid)
        for s in specs:
            procs.append(subprocess.Popen(nsenter(st["holders"][s.host]) + s.argv, env=s.env,
                                          start_new_session=True, stdin=subprocess.DEVNULL))
        job_procs = procs[1:] if uid else procs
        daemons = [p for p, s in zip(job_procs, specs) if s.daemon]
        return _watch(job_procs, [s.what for s in specs], timeout, grace, daemons)
    finally:
        kill_job(job)
        for p in procs:
            p.poll()
        if slurm_dir:
            slurm.remove(slurm_dir)
        for s, h in old.items():
            signal.signal(s, h)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
