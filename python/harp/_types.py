"""Datatypes, reduction ops and collective codes shared with the C++ core.

The one list is base/vocab.def (the C++ enums are built from it); the
classes, ITEMSIZE, _NP_TO_DT, _OP_NAMES and parse_dtype's aliases below mirror it
and scripts/check_vocab.py, run by the build, fails on any difference. The
integer values are part of the binding ABI.
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
    allreduce_coalesced = 13


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

# Bytes per element of each HARP datatype (base/types.cc dtypeSize).
ITEMSIZE = {DataType.int8: 1, DataType.uint8: 1, DataType.int32: 4, DataType.uint32: 4, DataType.int64: 8,
            DataType.uint64: 8, DataType.float16: 2, DataType.bfloat16: 2, DataType.float32: 4,
            DataType.float64: 8, DataType.bool: 1}

# p2p tags travel as uint32 (core/engine/communicator.h CollArgs::tag).
MAX_TAG = 2**32 - 1


def numpy_dtype(dt: DataType) -> np.dtype:
    """The numpy dtype holding a HARP datatype (bfloat16: ml_dtypes' when installed, else uint16)."""
    if dt == DataType.bfloat16:
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    return next(k for k, v in _NP_TO_DT.items() if v == dt)


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
    if isinstance(d, (bool, int, float)) or d is None:
        raise _invalid(f"dtype: {d!r} is not a datatype (a name such as 'float32', or a numpy dtype)")
    if isinstance(d, str):
        try:
            return DataType[{"half": "float16", "float": "float32", "double": "float64"}.get(d, d)]
        except KeyError:
            raise _invalid(f"dtype: unknown dtype '{d}' (known: {', '.join(x.name for x in DataType)})") from None
    try:
        return dtype_of(np.empty(0, dtype=d))
    except (TypeError, ValueError):
        raise _invalid(f"dtype: unknown dtype {d!r}") from None


def parse_op(op) -> ReduceOp:
    """A ReduceOp from a ReduceOp, a name ('sum', 'MAX', ...) or an integer code. bool and float are
    refused (op=True is not 'prod', op=3.0 is not 'max')."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        o = _OP_NAMES.get(op.lower())
        if o is None:
            raise _invalid(f"op: unknown reduction op '{op}' (known: {', '.join(_OP_NAMES)})")
        return o
    if is_int(op) and 0 <= op < len(ReduceOp):
        return ReduceOp(int(op))
    raise _invalid(f"op: {op!r} is not a reduction op (a name such as 'sum', or a harp.ReduceOp)")


def is_int(x) -> bool:
    """An integer argument: int or numpy integer, never bool (an int subclass) or float."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_int(x, what: str, lo: int, hi: int) -> int:
    """x as an int in [lo, hi], or InvalidArgumentError naming `what`."""
    if not is_int(x):
        raise _invalid(f"{what} must be an integer, got {type(x).__name__} {x!r}")
    if not lo <= x <= hi:
        raise _invalid(f"{what} {int(x)} is out of range [{lo}, {hi}]")
    return int(x)


def typed_count(arr: np.ndarray, override, what: str):
    """(HARP datatype, element count) of `arr` read as `override` (or as its own dtype).

    With a dtype override the count is arr.nbytes / itemsize, so count x itemsize is exactly the
    buffer's size; a buffer that is not a whole number of such elements is refused."""
    if override is None:
        try:
            return dtype_of(arr), arr.size
        except ValueError as e:
            raise _invalid(f"{what}: {e}") from None
    dt = parse_dtype(override)
    size = ITEMSIZE[dt]
    if arr.nbytes % size:
        raise _invalid(f"{what}: {arr.nbytes} bytes is not a whole number of dtype={dt.name} elements "
                       f"({size} bytes each)")
    return dt, arr.nbytes // size


def _invalid(msg):
    from .errors import InvalidArgumentError

    return InvalidArgumentError(msg)
