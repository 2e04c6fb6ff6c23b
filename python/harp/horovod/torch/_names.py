"""harp.horovod.torch's constants and error types, a leaf every module of the package imports."""
from __future__ import annotations

from harp.errors import HarpError

# Horovod's ReduceOp values (horovod/common/basics: AVERAGE=0, SUM=1, ADASUM=2, MIN=3, MAX=4, PRODUCT=5).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAME = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}


class HorovodInternalError(HarpError):
    """A collective failed (a lost rank, a timeout): Horovod's error type for it."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's signal that hosts changed (elastic training is not provided: see harp.horovod)."""
