"""Datatypes, reduction ops and collective codes shared with the C++ core.

The one list is base/vocab.def. The C++ enums are built from it, and so is the
table the compiled module hands over (``_harp.vocab()``, bindings/python_module.cc):
DataType, ReduceOp, Coll, ITEMSIZE, COLL_TRAITS, the numpy mapping and the name aliases
below are made from that table when harp is imported, so a datatype, op or collective
added to vocab.def needs no edit here. The integer values are part of the binding ABI.

COLL_TRAITS[coll] holds a collective's traits as vocab.def's HARP_COLL line declares
them (its header explains each): reduces, rooted, vcounts, the byte rule (send, recv:
what one rank's buffers hold for count c at p ranks, see buffer_elems), the in-place
rule and torch's name for it. Python reads them here, never re-derives them.
"""
from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

from . import _harp


class CollTraits(NamedTuple):
    """One HARP_COLL line of base/vocab.def, after its name and value."""
    reduces: bool
    rooted: bool
    vcounts: bool
    send: str     # byte rule of the send buffer: none, count, count_p, root_count, root_count_p, listed
    recv: str     # the same for the receive buffer
    inplace: str  # none, same, block, any, alone, unchecked
    torch: str    # torch's name ("nccl:<torch>" in its flight record and profiler)


def _classes(vocab: dict):
    """(DataType, ReduceOp, Coll, ITEMSIZE, numpy dtype -> DataType, op names, dtype aliases,
    COLL_TRAITS) from `vocab`, a table shaped like _harp.vocab()'s."""
    dt = enum.IntEnum("DataType", [(n, v) for n, v, *_ in vocab["dtypes"]], module=__name__, qualname="DataType")
    op = enum.IntEnum("ReduceOp", [(p, v) for _, v, p in vocab["ops"]], module=__name__, qualname="ReduceOp")
    coll = enum.IntEnum("Coll", [(n, v) for n, v, *_ in vocab["colls"]], module=__name__, qualname="Coll")
    itemsize = {dt[n]: size for n, _, size, *_ in vocab["dtypes"]}
    # numpy's own dtypes (bfloat16 is not one: ml_dtypes', recognised by name in dtype_of)
    np_to_dt = {np.dtype(getattr(np, npn)): dt[n] for n, _, _, npn, _ in vocab["dtypes"] if hasattr(np, npn)}
    by_name = {n: op(v) for n, v, _ in vocab["ops"]}
    op_names = {}
    for n, o in by_name.items():  # each op's name, then its aliases (the order error messages list them in)
        op_names[n] = o
        op_names.update({a: o for a, t in vocab["op_aliases"] if t == n})
    traits = {coll(v): CollTraits(*rest) for _, v, *rest in vocab["colls"]}
    return dt, op, coll, itemsize, np_to_dt, op_names, dict(vocab["dtype_aliases"]), traits


_VOCAB = _harp.vocab()
DataType, ReduceOp, Coll, ITEMSIZE, _NP_TO_DT, _OP_NAMES, _DTYPE_ALIASES, COLL_TRAITS = _classes(_VOCAB)
# bytes per element by ncclDataType_t value (harp.nccl)
NCCL_ITEMSIZE = {ncclv: size for _, _, size, _, ncclv in _VOCAB["dtypes"] if ncclv >= 0}
# torch's name of each collective, by HARP's name (profiler spans, harp.torch)
TORCH_NAMES = {c.name: t.torch for c, t in COLL_TRAITS.items()}


def buffer_blocks(extent: str, nranks: int, at_root: bool = True) -> int:
    """Blocks of `count` elements a buffer of this byte-rule extent (vocab.def) holds on one rank
    of `nranks`: 0 (no buffer there), 1 or nranks. `listed` gives 0 (such calls list their own)."""
    if extent == "count":
        return 1
    if extent == "count_p":
        return nranks
    if extent == "root_count":
        return 1 if at_root else 0
    if extent == "root_count_p":
        return nranks if at_root else 0
    return 0


def buffer_elems(coll, count: int, nranks: int, at_root: bool = True) -> tuple[int, int]:
    """(send, receive) buffer elements of one rank's part in a `coll` call of `count` at `nranks`
    ranks (`at_root`: this rank is the root): vocab.def's byte rule. 0: the rank uses no such buffer."""
    t = COLL_TRAITS[coll]
    return count * buffer_blocks(t.send, nranks, at_root), count * buffer_blocks(t.recv, nranks, at_root)

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
            return DataType[_DTYPE_ALIASES.get(d, d)]
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
