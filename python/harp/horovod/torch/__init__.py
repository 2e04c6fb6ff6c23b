"""harp.horovod.torch: `import harp.horovod.torch as hvd` for Horovod PyTorch scripts.

See harp/horovod/__init__.py for what is provided and what is not. Every
function below has Horovod's name, arguments and result; the collectives run on
one HARP communicator (harp.init(), or the one given to init()).

    hvd.init()
    out = hvd.allreduce(t)                          # average over ranks, new tensor
    h = hvd.allreduce_async_(t, op=hvd.Sum); hvd.synchronize(h)   # in place
    parts = hvd.allgather(t)                        # first dims may differ per rank

Ordering: HARP pairs collectives by issue order (Horovod negotiated them by
name), so every rank must start the same operations in the same order; a
disagreement in size, dtype or op is reported as harp.MismatchError on every
rank. DistributedOptimizer keeps the order itself (see _optimizer.py).
"""
from __future__ import annotations

from ._names import (  # noqa: F401  (hvd.Average ... hvd.HorovodInternalError)
    Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min, Product, Sum)
from ._api import *  # noqa: F401,F403  (every hvd function)
from ._api import _comm, _state  # noqa: F401  (used by the package's helpers and tests)
from ._compression import Compression  # noqa: F401  (hvd.Compression)
from ._optimizer import DistributedOptimizer  # noqa: F401
from . import elastic  # noqa: F401  (hvd.elastic)
