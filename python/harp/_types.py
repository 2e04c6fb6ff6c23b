"""Datatypes, reduction ops and collective codes shared with the C++ core.

The integer values match core/types.h (part of the binding ABI).
"""
from __future__ import annotations

import enum

import numpy as np


class DataType(enum.IntEnum):
    int8 = 0
    uint8 = 1
    int32 = 2
    uint32 = 3
    int64 = 4
    uint64 = 5
    float16 = 6
    bfloat16 = 7
    float32 = 8
    float64 = 9
    bool = 10


class ReduceOp(enum.IntEnum):
    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


class Coll(enum.IntEnum):
    allreduce = 0
    broadcast = 1
    reduce = 2
    allgather = 3
    reduce_scatter = 4
    alltoall = 5
    alltoallv = 6
    gather = 7
    scatter = 8
    barrier = 9
    send = 10
    recv = 11
    p2p_batch = 12


_NP_TO_DT = {
    np.dtype(np.int8): DataType.int8,
    np.dtype(np.uint8): DataType.uint8,
    np.dtype(np.int32): DataType.int32,
    np.dtype(np.uint32): DataType.uint32,
    np.dtype(np.int64): DataType.int64,
    np.dtype(np.uint64): DataType.uint64,
    np.dtype(np.float16): DataType.float16,
    np.dtype(np.float32): DataType.float32,
    np.dtype(np.float64): DataType.float64,
    np.dtype(np.bool_): DataType.bool,
}

_OP_NAMES = {
    "sum": ReduceOp.SUM, "prod": ReduceOp.PROD, "product": ReduceOp.PROD, "min": ReduceOp.MIN,
    "max": ReduceOp.MAX, "avg": ReduceOp.AVG, "mean": ReduceOp.AVG, "band": ReduceOp.BAND,
    "bor": ReduceOp.BOR, "bxor": ReduceOp.BXOR,
}

# Op names and codes accepted as-is by the fast call path (exact spelling).
OP_CODES = {**{k: int(v) for k, v in _OP_NAMES.items()}, **{v: int(v) for v in ReduceOp}}


def dtype_of(arr: np.ndarray, override=None) -> DataType:
    """HARP datatype of a numpy array (bfloat16 from ml_dtypes is recognised)."""
    if override is not None:
        return parse_dtype(override)
    dt = _NP_TO_DT.get(arr.dtype)
    if dt is not None:
        return dt
    if arr.dtype.name == "bfloat16":
        return DataType.bfloat16
    raise _invalid(f"unsupported dtype {arr.dtype} (supported: {', '.join(d.name for d in DataType)})")


def parse_dtype(d) -> DataType:
    if isinstance(d, DataType):
        return d
    if isinstance(d, str):
        try:
            return DataType[{"half": "float16", "float": "float32", "double": "float64"}.get(d, d)]
        except KeyError:
            raise _invalid(f"unknown dtype '{d}' (known: {', '.join(x.name for x in DataType)})") from None
    try:
        return dtype_of(np.empty(0, dtype=d))
    except TypeError:
        raise _invalid(f"unknown dtype {d!r}") from None


def parse_op(op) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        o = _OP_NAMES.get(op.lower())
        if o is None:
            raise _invalid(f"unknown reduction op '{op}' (known: {', '.join(_OP_NAMES)})")
        return o
    if isinstance(op, int) and 0 <= op < len(ReduceOp):
        return ReduceOp(op)
    raise _invalid(f"unknown reduction op {op!r}")


def _invalid(msg):
    from .errors import InvalidArgumentError

    return InvalidArgumentError(msg)
