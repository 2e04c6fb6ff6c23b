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
          per host that runner.run starts for the job (harp_dev.cluster.slurm).
ray:      one Ray node per host (`ray start --block`; the head on host 0, each
          node with its own /tmp/ray as on separate machines and `harp_slot`
          resources = ranks per host) and, on host 0, the Ray Train driver
          (harp_dev.cluster.ray_job) running the script in a TorchTrainer with
          TorchConfig(backend=--backend of the script, default harp).
Address-based launches (torchrun, mpirun, slurm) get HARP_SECRET, a fresh random
value per job, as harp.init() needs it there; HARP_ADDR for mpirun and slurm. Under harp
mpirun and slurm the arena also sets MASTER_ADDR/MASTER_PORT (host 0:29510), as job
scripts on real clusters do, so init_process_group(rank=, world_size=) works.
"""
from __future__ import annotations

import os
import secrets
import shlex
import sys
from dataclasses import dataclass

from . import slurm
from . import topology as topo

LAUNCHERS = ("harp", "torchrun", "mpirun", "slurm", "ray")
TORCH_RDZV_PORT = 29400
HARP_MPI_PORT = 29500
TORCH_STORE_PORT = 29510
RAY_PORT = 6379


@dataclass
class Spec:
    host: int
    argv: list
    env: dict
    what: str
    daemon: bool = False  # a service of the job (a Ray node): stopped when the other processes end


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


def _script_backend(cmd):
    for i, arg in enumerate(cmd):
        if arg == "--backend" and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith("--backend="):
            return arg.split("=", 1)[1]
    return "harp"


def _ray(st, hosts, ppn, cmd, env):
    head = f"{topo.address(st['slot'], 0)}:{RAY_PORT}"
    # Ray's token authentication with a fresh token per job, given to every node and the driver
    e = dict(env, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
             # the arena's hosts share this machine's cores: Ray's per-node agents start slowly when it is busy
             RAY_agent_register_timeout_ms="300000",
             # forward every worker's lines as they are (Ray merges lines that differ only in numbers)
             RAY_DEDUP_LOGS="0")
    out = []
    for h in range(hosts):
        role = ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"] if h == 0 else [f"--address={head}"]
        # the head also hosts Ray Train's controller: one more CPU there, no more harp slots
        cpus = ppn + (1 if h == 0 else 0)
        start = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
                 f"--node-ip-address={topo.address(st['slot'], h)}", f"--num-cpus={cpus}",
                 f'--resources={{"harp_slot": {ppn}}}',
                 # fixed agent ports (each host has its own network namespace): the raylet then does not wait
                 # for the agents to write their ports to files, a wait that times out on a busy machine
                 "--metrics-export-port=52360", "--dashboard-agent-listen-port=52361",
                 "--dashboard-agent-grpc-port=52362", "--runtime-env-agent-port=52363", *role]
        # Ray keeps sockets and session files under /tmp/ray: a private one per host (its mount namespace)
        # A node that starts before the head has registered gives up: retry (30 times, 2 s apart).
        argv = ["/bin/sh", "-c", 'mkdir -p /tmp/ray && mount -t tmpfs -o size=1g harp-ray /tmp/ray || exit 1; n=0; '
                'until "$@"; do n=$((n + 1)); [ $n -ge 30 ] && exit 1; sleep 2; done', "ray-node", *start]
        out.append(Spec(h, argv, e, f"ray node on host {h}", daemon=True))
    driver = [sys.executable, "-m", "harp_dev.cluster.ray_job", f"--address={head}", f"--nodes={hosts}",
              f"--workers={hosts * ppn}", f"--backend={_script_backend(cmd)}", "--", *python_cmd(cmd)]
    out.append(Spec(0, driver, e, "Ray Train driver"))
    return out


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
    if launcher == "ray":
        return _ray(st, hosts, ppn, cmd, env)
    raise ValueError(f"launcher {launcher!r}: one of {', '.join(LAUNCHERS)}")


def shell_line(spec):
    return " ".join(shlex.quote(a) for a in spec.argv)
