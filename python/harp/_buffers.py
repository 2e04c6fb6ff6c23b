"""Turning user buffers into (address, element count, dtype) for the core.

Accepted: numpy arrays, objects with the buffer protocol (bytearray, array,
memoryview) and DLPack producers on the CPU. Buffers must be C-contiguous;
receive buffers must be writable. GPU buffers go through harp.nccl/harp.torch.
"""
from __future__ import annotations

import numpy as np

from ._types import numpy_dtype, parse_dtype, typed_count
from .errors import InvalidArgumentError


def as_array(obj, what: str, writable: bool = False) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        arr = obj
    elif hasattr(obj, "__dlpack__") and not isinstance(obj, (bytes, bytearray, memoryview)):
        try:
            arr = np.from_dlpack(obj)
        except (TypeError, RuntimeError, BufferError) as e:
            raise InvalidArgumentError(f"{what}: cannot use {type(obj).__name__} through DLPack on the CPU: {e}") from e
    else:
        try:
            arr = np.asarray(memoryview(obj))
        except TypeError:
            raise InvalidArgumentError(
                f"{what}: {type(obj).__name__} is not an array, buffer or DLPack object") from None
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError(f"{what}: buffer must be C-contiguous (use numpy.ascontiguousarray)")
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError(f"{what}: buffer is read-only")
    return arr


def address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0] if arr.size else 0


def torch_cpu_view(t):
    """(numpy view, harp dtype name or None) of a contiguous CPU torch tensor, sharing its memory.

    numpy has no bfloat16, so a bfloat16 tensor is viewed as int16 and the name
    "bfloat16" tells the caller to pass dtype="bfloat16"; complex tensors are
    viewed as pairs of their real type (exact for sum, the only reduction that
    means anything on complex values). None: the view's own dtype is right.
    The caller checks device and contiguity (with its own message)."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    if t.dtype.is_complex:
        return torch.view_as_real(t).numpy(), None
    return t.numpy(), None


def out_buffer(recvbuf, like: np.ndarray, dtype, count: int, what: str, shape=None):
    """A writable output holding exactly `count` elements of the call's datatype: recvbuf
    checked (count x itemsize == its size), or a new array when recvbuf is None."""
    if recvbuf is None:
        if dtype is not None:  # count is in the override's elements
            return np.empty(count, dtype=numpy_dtype(parse_dtype(dtype)))
        return np.empty(shape if shape is not None else (count,), dtype=like.dtype)
    out = as_array(recvbuf, f"{what}: recvbuf", writable=True)
    if dtype is None and out.dtype != like.dtype:
        raise InvalidArgumentError(f"{what}: recvbuf dtype {out.dtype} differs from sendbuf dtype {like.dtype}")
    _, n = typed_count(out, dtype, f"{what}: recvbuf")
    if n != count:
        raise InvalidArgumentError(f"{what}: recvbuf has {n} elements, expected {count}")
    return out
