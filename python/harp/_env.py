"""harp.init(): a communicator from the launcher's environment.

Understood, in this order:
  * HARP: HARP_UNIQUE_ID (hex, set by harp-run) or HARP_ADDR=host:port, with
    HARP_RANK and HARP_WORLD_SIZE.
  * torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK. HARP's
    root listens on MASTER_PORT + 1 (torchrun's own store may hold MASTER_PORT).
  * Open MPI: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (+ HARP_ADDR).
  * Slurm: SLURM_PROCID / SLURM_NTASKS; without HARP_ADDR or MASTER_ADDR,
    rank 0's host is the first node of SLURM_STEP_NODELIST and the port comes
    from the job and step ids (harp/_slurm.py; HARP_PORT overrides it).
With an address instead of a unique id, rank 0 serves the bootstrap store
there, and every rank must hold the same HARP_SECRET (the store and every
data-plane connection authenticate with keys derived from it; see
SECURITY.md). Without HARP_SECRET, harp.init() refuses to start: a secret
made from public facts (job id, address, size) would let anyone who can
reach the port join the job; one under 16 bytes is refused too, and the key
is derived from it with scrypt (secret_key). The exceptions hand a random secret around:
harp-run (HARP_UNIQUE_ID carries one), and torchrun after
torch.distributed.init_process_group() (the rendezvous then goes through
torch's store, like the torch backend's, and rank 0's random token).
"""
from __future__ import annotations

import hashlib
import os

from . import _harp, _slurm
from .comm import Communicator, UniqueId
from .errors import HarpError, InvalidArgumentError

_RANK_VARS = [("HARP_RANK", "HARP_WORLD_SIZE"), ("RANK", "WORLD_SIZE"),
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
              ("SLURM_PROCID", "SLURM_NTASKS")]


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
    slurm = _slurm.step_address(env)
    if slurm:
        return slurm
    raise InvalidArgumentError(
        "harp.init(): no rendezvous address; set HARP_ADDR=host:port (rank 0's host), or HARP_UNIQUE_ID, "
        "or MASTER_ADDR/MASTER_PORT")


_SECRET_HELP = ("export HARP_SECRET=$(python3 -c 'import secrets;print(secrets.token_hex(32))') and give every "
                "rank the same value (e.g. through the launcher's environment)")
MIN_SECRET_BYTES = 16


def secret_key(secret: str) -> bytes:
    """The 32-byte job key behind HARP_SECRET: scrypt (N=2**14, r=8, p=1, about 0.1 s and 16 MiB),
    so that each guess of a secret costs an attacker as much; refuses secrets under
    MIN_SECRET_BYTES bytes (InvalidArgumentError naming HARP_SECRET)."""
    raw = secret.encode()
    if len(raw) < MIN_SECRET_BYTES:
        raise InvalidArgumentError(
            f"HARP_SECRET is {len(raw)} bytes long; a job secret needs at least {MIN_SECRET_BYTES} bytes of "
            f"random text (a short or guessable one can be found by trying). {_SECRET_HELP}")
    return hashlib.scrypt(raw, salt=b"HARP_SECRET/1", n=2**14, r=8, p=1, maxmem=64 << 20, dklen=32)
_init_count = 0


def _torch_store():
    """torch's default store when torch.distributed is initialized (else None)."""
    import sys

    if "torch.distributed" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        return c10d._get_default_store() if dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - an older or partial torch: fall back to HARP_SECRET
        return None


def init(*, timeout: float | None = None, transport: str | None = None, env=None) -> Communicator:
    """Create the world communicator from the launcher's environment (see module doc)."""
    global _init_count
    env = os.environ if env is None else env
    rank, size, _ = launch_env(env)
    if env.get("HARP_UNIQUE_ID"):
        uid = UniqueId.from_hex(env["HARP_UNIQUE_ID"])
        return Communicator(rank, size, uid, timeout=timeout, transport=transport)
    addr = _address(env)
    secret = env.get("HARP_SECRET")
    if not secret:
        store = _torch_store() if env.get("MASTER_ADDR") and not env.get("HARP_ADDR") else None
        if store is not None:
            from .torch._store import TorchStore

            _init_count += 1
            return Communicator.from_store(TorchStore(store), rank, size, prefix=f"harp/init{_init_count}/",
                                           timeout=timeout, transport=transport)
        raise InvalidArgumentError(
            f"harp.init(): rendezvous at {addr} needs a job secret shared by every rank, and HARP_SECRET is not "
            f"set. {_SECRET_HELP}. (harp-run sets HARP_UNIQUE_ID instead, which carries a random secret.)")
    key = secret_key(secret)
    uid = UniqueId(_harp.make_unique_id(addr, key))
    if rank == 0:
        try:
            _harp.ensure_store_server(uid.address, key)
        except HarpError as e:
            # Someone already listens there: maybe a second process started as
            # rank 0 (the rendezvous reports "duplicate rank 0"), maybe another
            # job (its root refuses our secret). Either way the error that
            # follows says more than "Address already in use".
            if "in use" not in str(e):
                raise
    return Communicator(rank, size, uid, timeout=timeout, transport=transport)
