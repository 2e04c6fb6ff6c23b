"""A real Slurm cluster on the arena's hosts, for one job (`--launcher slurm`).

    d = slurm.start(st, hosts=3, ppn=2, env=env, job=job, enter=runner.nsenter)
    # -> host 0 runs slurmctld, every host its own slurmd (NodeName = its hostname,
    #    NodeAddr = its address); munged runs in the root namespace. Returns when
    #    `sinfo` shows every node idle (or raises RuntimeError with the logs' tails).
    argv = slurm.srun_argv(d, hosts, ppn, cmd)   # run on host 0 with SLURM_CONF=d/slurm.conf
    ...
    slurm.remove(d)                              # after the job's processes are gone

The daemons are Debian 12's slurmctld/slurmd 22.05 and munge 0.5, configured as
a small site would (auth/munge, cons_tres by CPU, one partition "arena"), except
for what emulation needs: every file lives in a private per-job folder under the
arena's state directory (0700; a fresh random munge key per job), slurmd gets
`SlurmdParameters=config_overrides` (the emulated hosts share this machine's
cores: each is declared with max(ppn, 1) CPUs), and proctrack/linuxproc with
task/none (no cgroup confinement). slurmd still initialises its cgroup plugin,
so each host's private mount namespace gets the cgroup v1 hierarchies mounted
(`ip netns exec` replaced /sys there); the root namespace is not touched.

Lifetime: every daemon carries the job's HARP_CLUSTER_JOB tag in its
environment, so runner.kill_job() stops them with the job's ranks (also after a
SIGKILLed harp-cluster, through the reaper); remove() deletes the folder and
net.down() deletes any folder a killed run left.

Rank environment under srun is the one real Slurm sites give: SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST...; the launcher
adds HARP_ADDR (host 0) and HARP_SECRET, as a job script does, so harp.init()
and init_process_group("harp") work unmodified.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

from . import topology as topo

CTLD_PORT = 6817
SLURMD_PORT = 6818
READY_TIMEOUT_S = 45.0
CGROUP_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")


def available():
    """'' when slurmctld, slurmd, srun, sinfo and munged are installed, else what is missing."""
    missing = [t for t in ("slurmctld", "slurmd", "srun", "sinfo", "munged") if shutil.which(t) is None]
    return f"{', '.join(missing)} not installed (apt: slurmctld slurmd slurm-client munge)" if missing else ""


def job_dir(st, job):
    return os.path.join(topo.STATE_DIR, f"{st['name']}.slurm-{job}")


def conf_path(d):
    return os.path.join(d, "slurm.conf")


def _conf(st, d, hosts, ppn):
    name = st["name"]
    nodes = "\n".join(f"NodeName={topo.hostname(name, i)} NodeAddr={topo.address(st['slot'], i)} "
                      f"CPUs={max(ppn, 1)} State=UNKNOWN" for i in range(hosts))
    return f"""# harp-cluster: Slurm for one job on arena cluster {name} (written by harp_dev.cluster.slurm)
ClusterName=harp{name.lower()}
SlurmctldHost={topo.hostname(name, 0)}({topo.address(st['slot'], 0)})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/slurmd.%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
{nodes}
PartitionName=arena Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _mount_cgroups(holder, enter):
    """cgroup v1 hierarchies in host `holder`'s private mount namespace (idempotent)."""
    script = "mountpoint -q /sys/fs/cgroup || mount -t tmpfs -o mode=755 harp_cgroup /sys/fs/cgroup; "
    for c in CGROUP_CONTROLLERS:
        script += f"mkdir -p /sys/fs/cgroup/{c}; mountpoint -q /sys/fs/cgroup/{c} || mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}; "
    script += ("mkdir -p /sys/fs/cgroup/systemd; mountpoint -q /sys/fs/cgroup/systemd || "
               "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd")
    r = subprocess.run(["nsenter", "-t", str(holder), "-m", "--", "sh", "-c", script], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"slurm: mounting cgroup hierarchies for slurmd failed: {r.stderr.strip()}")


def _spawn(argv, env, log):
    with open(log, "w") as f:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _tails(d):
    out = []
    for f in sorted(os.listdir(d)):
        if f.endswith((".log", ".out")):
            with open(os.path.join(d, f), errors="replace") as fh:
                lines = fh.read().splitlines()[-4:]
            out.append(f"  {f}: " + " | ".join(lines))
    return "\n".join(out)


def start(st, hosts, ppn, env, job, enter):
    """Start munged, slurmctld and one slurmd per host for `job`; returns the job's folder."""
    why = available()
    if why:
        raise RuntimeError(f"--launcher slurm: {why}")
    d = job_dir(st, job)
    os.makedirs(os.path.join(d, "ctld"), mode=0o700)
    os.chmod(d, 0o700)
    for i in range(hosts):
        os.makedirs(os.path.join(d, f"slurmd.{topo.hostname(st['name'], i)}"))
    key = os.path.join(d, "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(1024))
    with open(conf_path(d), "w") as f:
        f.write(_conf(st, d, hosts, ppn))
    env = dict(env, SLURM_CONF=conf_path(d))
    _spawn(["munged", "-F", "-f", f"--socket={d}/munge.sock", f"--key-file={key}", f"--pid-file={d}/munged.pid",
            f"--seed-file={d}/munged.seed", f"--log-file={d}/munged.log"], env, os.path.join(d, "munged.out"))
    holders = st["holders"]
    for i in range(hosts):
        _mount_cgroups(holders[i], enter)
    _spawn(enter(holders[0]) + ["slurmctld", "-D", "-i", "-f", conf_path(d)], env, os.path.join(d, "ctld.out"))
    for i in range(hosts):
        _spawn(enter(holders[i]) + ["slurmd", "-D", "-N", topo.hostname(st["name"], i), "-f", conf_path(d)],
               env, os.path.join(d, f"slurmd{i}.out"))
    _wait_idle(d, hosts, holders[0], env, enter)
    return d


def _wait_idle(d, hosts, holder0, env, enter):
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        r = subprocess.run(enter(holder0) + ["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True,
                           text=True, timeout=30)
        last = (r.stdout + r.stderr).strip()
        states = [l.split()[1] for l in r.stdout.splitlines() if len(l.split()) == 2]
        if r.returncode == 0 and len(states) == hosts and all(s == "idle" for s in states):
            return
        time.sleep(0.5)
    raise RuntimeError(f"slurm: nodes not idle within {READY_TIMEOUT_S:g} s (sinfo: {last!r})\n{_tails(d)}")


def srun_argv(d, hosts, ppn, cmd):
    return ["srun", f"--nodes={hosts}", f"--ntasks={hosts * ppn}", f"--ntasks-per-node={ppn}", "--export=ALL",
            "--mpi=none", f"--chdir={os.getcwd()}", "--job-name=harp-cluster", *cmd]


def remove(d):
    shutil.rmtree(d, ignore_errors=True)
