"""HARP — userspace collective communication for distributed training.

Quick start (run under ``harp-run -n 4 python prog.py``, torchrun or mpirun)::

    import numpy as np, harp
    comm = harp.init()
    x = np.full(1024, comm.rank, dtype=np.float32)
    comm.allreduce(x)            # in place: x = sum over ranks

See README.md for the launchers, environment variables and the other APIs
(harp.nccl, the torch.distributed backend, harp-bench).
"""
from __future__ import annotations

from ._version import __version__

from . import _harp
from ._types import DataType, ReduceOp
from .comm import Communicator, UniqueId, Work, get_unique_id
from .errors import (HarpError, HarpTimeoutError, InvalidArgumentError, MismatchError, PeerError,
                     UnavailableError)
from ._env import init, launch_env
from .topology import topology  # noqa: F401  (host map of a communicator, harp.topology)
from . import compress  # noqa: F401  (wire compression, harp.compress)
from .errors import RevokedError  # fault tolerance; harp.elastic is imported on use

SUM, PROD, MIN, MAX, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG
BAND, BOR, BXOR = ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR
UNDEFINED = -1

int8, uint8, int32, uint32, int64, uint64 = (DataType.int8, DataType.uint8, DataType.int32, DataType.uint32,
                                             DataType.int64, DataType.uint64)
float16, bfloat16, float32, float64, bool_ = (DataType.float16, DataType.bfloat16, DataType.float32,
                                              DataType.float64, DataType.bool)


def transports():
    """[(name, priority, why_unavailable or '')] for every transport this build knows."""
    return _harp.transports()


__all__ = [
    "Communicator", "UniqueId", "Work", "get_unique_id", "init", "launch_env", "transports", "DataType", "ReduceOp",
    "HarpError", "HarpTimeoutError", "InvalidArgumentError", "MismatchError", "PeerError", "UnavailableError",
    "RevokedError", "__version__",
    "SUM", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "UNDEFINED",
]
