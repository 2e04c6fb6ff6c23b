"""Command lines of the real launchers, run inside the arena's hosts.

    specs = launchers.plan(st, "torchrun", hosts=3, ppn=2, cmd=["python", "train.py"], base_env=env)
    # -> [Spec(host, argv, env, stdin_pipe), ...]: runner.py starts each inside its host

harp:     one process per rank, harp-run's environment (HARP_UNIQUE_ID of a
          store served from host 0, HARP_RANK, HARP_WORLD_SIZE, HARP_LOCAL_*,
          RANK/WORLD_SIZE/LOCAL_RANK).
torchrun: one `torchrun` agent per host, c10d rendezvous at host 0:29400.
mpirun:   Open MPI's mpirun started on host 0, reaching the other hosts with an
          rsh agent script that nsenters their namespaces; TCP BTL on eth0.
slurm:    Slurm's srun on host 0, against a slurmctld on host 0 and one slurmd
          per host that runner.run starts for the job (harp.cluster.slurm).
Address-based launches (torchrun, mpirun, slurm) get HARP_SECRET, a fresh random
value per job, as harp.init() needs it there; HARP_ADDR for mpirun and slurm. Under harp
mpirun and slurm the arena also sets MASTER_ADDR/MASTER_PORT (host 0:29510), as job
scripts on real clusters do, so init_process_group(rank=, world_size=) works.
"""
from __future__ import annotations

import os
import secrets
import shlex
import shutil
import sys
from dataclasses import dataclass

from . import slurm
from . import topology as topo

LAUNCHERS = ("harp", "torchrun", "mpirun", "slurm")
TORCH_RDZV_PORT = 29400
HARP_MPI_PORT = 29500
TORCH_STORE_PORT = 29510


@dataclass
class Spec:
    host: int
    argv: list
    env: dict
    what: str


def python_cmd(cmd):
    return [sys.executable] + list(cmd) if cmd and cmd[0].endswith(".py") else list(cmd)


def _harp(st, hosts, ppn, cmd, env, uid_hex):
    size = hosts * ppn
    out = []
    for r in range(size):
        h, local = divmod(r, ppn)
        e = dict(env, HARP_UNIQUE_ID=uid_hex, HARP_RANK=str(r), HARP_WORLD_SIZE=str(size),
                 HARP_LOCAL_RANK=str(local), HARP_LOCAL_WORLD_SIZE=str(ppn), RANK=str(r), WORLD_SIZE=str(size),
                 LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(ppn))
        out.append(Spec(h, python_cmd(cmd), e, f"rank {r}"))
    return out


def _torchrun(st, hosts, ppn, cmd, env, job):
    ep = f"{topo.address(st['slot'], 0)}:{TORCH_RDZV_PORT}"
    out = []
    for h in range(hosts):
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={hosts}", f"--nproc-per-node={ppn}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={ep}", f"--rdzv-id={job}",
                "--max-restarts=0", "--no-python", *python_cmd(cmd)]
        out.append(Spec(h, argv, dict(env), f"torchrun agent on host {h}"))
    return out


def mpi_agent(st, holders):
    """Write the rsh agent Open MPI uses to reach host <hostname>: it nsenters that host."""
    path = os.path.join(topo.STATE_DIR, f"{st['name']}.mpi-agent")
    cases = "\n".join(f"  {topo.hostname(st['name'], i)}) pid={pid} ;;" for i, pid in enumerate(holders))
    text = f"""#!/bin/sh
# Open MPI rsh agent for arena cluster {st['name']}: agent [opts] HOST CMD...
while [ $# -gt 0 ] && [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case $host in
{cases}
  *) echo "harp-cluster mpi agent: unknown host $host" >&2; exit 255 ;;
esac
exec nsenter -t "$pid" -n -u -m --wd=/ -- /bin/sh -c "$*"
"""
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def _mpirun(st, hosts, ppn, cmd, env):
    agent = mpi_agent(st, st["holders"])
    hostlist = ",".join(f"{topo.hostname(st['name'], i)}:{ppn}" for i in range(hosts))
    e = dict(env, HARP_ADDR=f"{topo.address(st['slot'], 0)}:{HARP_MPI_PORT}")
    # The emulated hosts share this machine's cores, which Open MPI cannot see: without yielding,
    # its busy-polling ranks starve each other (8 B allreduce measured 2.6-8.5 ms vs 68-195 us).
    e.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    exported = [k for k in e if k.startswith(("HARP_", "PYTHON", "OMP_", "TORCH", "GLOO", "MKL_", "MASTER_", "OMPI_MCA_"))]
    argv = ["mpirun", "--allow-run-as-root", "-np", str(hosts * ppn), "--host", hostlist, "--map-by", "slot",
            "--mca", "plm_rsh_agent", agent, "--mca", "btl", "tcp,vader,self", "--mca", "btl_tcp_if_include",
            "eth0", "--mca", "oob_tcp_if_include", "eth0", "--mca", "pml", "ob1", "--wdir", os.getcwd()]
    for k in sorted(exported):
        argv += ["-x", k]
    argv += python_cmd(cmd)
    return [Spec(0, argv, e, "mpirun")]


def _slurm(st, hosts, ppn, cmd, env, job):
    e = dict(env, HARP_ADDR=f"{topo.address(st['slot'], 0)}:{HARP_MPI_PORT}",
             SLURM_CONF=slurm.conf_path(slurm.job_dir(st, job)))
    return [Spec(0, slurm.srun_argv(slurm.job_dir(st, job), hosts, ppn, python_cmd(cmd)), e, "srun")]


def plan(st, launcher, hosts, ppn, cmd, base_env, job, uid_hex=None):
    """Specs for one job; base_env already carries the job tag."""
    env = dict(base_env)
    if launcher != "torchrun":
        env.update(MASTER_ADDR=topo.address(st["slot"], 0), MASTER_PORT=str(TORCH_STORE_PORT))
    if launcher != "harp":
        env["HARP_SECRET"] = secrets.token_hex(16)
    if launcher == "harp":
        return _harp(st, hosts, ppn, cmd, env, uid_hex)
    if launcher == "torchrun":
        return _torchrun(st, hosts, ppn, cmd, env, job)
    if launcher == "mpirun":
        return _mpirun(st, hosts, ppn, cmd, env)
    if launcher == "slurm":
        return _slurm(st, hosts, ppn, cmd, env, job)
    raise ValueError(f"launcher {launcher!r}: one of {', '.join(LAUNCHERS)}")


def shell_line(spec):
    return " ".join(shlex.quote(a) for a in spec.argv)
