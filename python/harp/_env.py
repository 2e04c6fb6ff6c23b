"""harp.init(): a communicator from the launcher's environment.

Understood, in this order:
  * HARP: HARP_UNIQUE_ID (hex, set by harp-run) or HARP_ADDR=host:port, with
    HARP_RANK and HARP_WORLD_SIZE.
  * torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK. HARP's
    root listens on MASTER_PORT + 1 (torchrun's own store may hold MASTER_PORT).
  * Open MPI: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (+ HARP_ADDR).
  * Slurm: SLURM_PROCID / SLURM_NTASKS (+ HARP_ADDR).
With an address instead of a unique id, rank 0 serves the bootstrap store
there, and the job secret is HARP_SECRET or, failing that, derived from the
launcher's job id (so stray connections are still refused).
"""
from __future__ import annotations

import hashlib
import os

from . import _harp
from .comm import Communicator, UniqueId
from .errors import InvalidArgumentError

_RANK_VARS = [("HARP_RANK", "HARP_WORLD_SIZE"), ("RANK", "WORLD_SIZE"),
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
              ("SLURM_PROCID", "SLURM_NTASKS")]
_JOB_VARS = ["HARP_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "PMIX_NAMESPACE"]


def launch_env(env=None):
    """(rank, size, local_rank) from the environment, or raise naming what is missing."""
    env = os.environ if env is None else env
    for rk, sz in _RANK_VARS:
        if rk in env and sz in env:
            try:
                rank, size = int(env[rk]), int(env[sz])
            except ValueError:
                raise InvalidArgumentError(f"{rk}={env[rk]!r} / {sz}={env[sz]!r} are not integers") from None
            local = env.get("LOCAL_RANK", env.get("HARP_LOCAL_RANK", env.get("OMPI_COMM_WORLD_LOCAL_RANK",
                            env.get("SLURM_LOCALID", "0"))))
            return rank, size, int(local)
    raise InvalidArgumentError(
        "harp.init(): no rank/size in the environment; run under harp-run, torchrun, mpirun or srun, "
        "or set HARP_RANK and HARP_WORLD_SIZE")


def _address(env):
    if env.get("HARP_ADDR"):
        return env["HARP_ADDR"]
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{int(env['MASTER_PORT']) + 1}"
    raise InvalidArgumentError(
        "harp.init(): no rendezvous address; set HARP_ADDR=host:port (rank 0's host), or HARP_UNIQUE_ID, "
        "or MASTER_ADDR/MASTER_PORT")


def init(*, timeout: float | None = None, transport: str | None = None, env=None) -> Communicator:
    """Create the world communicator from the launcher's environment (see module doc)."""
    env = os.environ if env is None else env
    rank, size, _ = launch_env(env)
    if env.get("HARP_UNIQUE_ID"):
        uid = UniqueId.from_hex(env["HARP_UNIQUE_ID"])
    else:
        addr = _address(env)
        secret = env.get("HARP_SECRET")
        if secret:
            key = hashlib.sha256(secret.encode()).digest()
        else:
            job = next((env[v] for v in _JOB_VARS if env.get(v)), "")
            key = hashlib.sha256(f"harp-job:{job}:{addr}:{size}".encode()).digest()
        uid = UniqueId(_harp.make_unique_id(addr, key))
        if rank == 0:
            _harp.ensure_store_server(uid.address, key)
    return Communicator(rank, size, uid, timeout=timeout, transport=transport)
