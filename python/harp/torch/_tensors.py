"""Tensors to (address, count, harp dtype) for the core, without copies when possible.

* Contiguous CPU tensors go to HARP as they are (tensor.data_ptr()).
* Non-contiguous CPU tensors travel through a contiguous copy; outputs are
  copied back when the operation finishes.
* CUDA tensors are staged through pinned host memory in the order of the
  CUDA stream that was current when the operation was issued: the device->host
  copy completes before HARP reads, and the host->device copy-back is queued
  on that same stream when the operation finishes.
* dtypes HARP has natively map 1:1; complex travels as pairs of its real type;
  int16/uint16 (no HARP type) travel as bytes, and for reductions are widened
  to int32 (exact: sums/products wrap modulo 2^16 the same way, min/max and
  bitwise ops are unchanged) and narrowed back.

Threading: a Staged object is created on the issuing thread and finished
(copy-back) exactly once, on whichever thread completes the work.
"""
from __future__ import annotations

import torch

from .._types import DataType, ReduceOp

_NATIVE = {
    torch.bool: DataType.bool,
    torch.int8: DataType.int8,
    torch.uint8: DataType.uint8,
    torch.int32: DataType.int32,
    torch.int64: DataType.int64,
    torch.float16: DataType.float16,
    torch.bfloat16: DataType.bfloat16,
    torch.float32: DataType.float32,
    torch.float64: DataType.float64,
    torch.complex64: DataType.float32,
    torch.complex128: DataType.float64,
}
for _name, _dt in (("uint32", DataType.uint32), ("uint64", DataType.uint64)):
    if hasattr(torch, _name):
        _NATIVE[getattr(torch, _name)] = _dt
_WIDEN = {torch.int16: torch.int32}
if hasattr(torch, "uint16"):
    _WIDEN[torch.uint16] = torch.int32

_OPS = {
    "SUM": ReduceOp.SUM, "PRODUCT": ReduceOp.PROD, "MIN": ReduceOp.MIN, "MAX": ReduceOp.MAX,
    "AVG": ReduceOp.AVG, "BAND": ReduceOp.BAND, "BOR": ReduceOp.BOR, "BXOR": ReduceOp.BXOR,
}


class UnsupportedError(ValueError):
    pass


def reduce_op_name(reduce_op) -> str:
    """"SUM", "AVG", "PREMUL_SUM", ... of a torch ReduceOp / RedOpType."""
    red = getattr(reduce_op, "op", reduce_op)
    return getattr(red, "name", str(red)).split(".")[-1]


def harp_op(reduce_op):
    """(harp ReduceOp, premul factor or None) of a torch ReduceOp / RedOpType."""
    name = reduce_op_name(reduce_op)
    if name == "PREMUL_SUM":
        return ReduceOp.SUM, reduce_op.factor
    if name not in _OPS:
        raise UnsupportedError(f"reduction {name} is not supported by harp")
    return _OPS[name], None


_WIRE_CACHE = {}


def wire_dtype(dtype, reducing: bool):
    """(harp dtype, elements per tensor element, widen-to dtype or None)."""
    hit = _WIRE_CACHE.get((dtype, reducing))
    if hit is None:
        hit = _WIRE_CACHE[(dtype, reducing)] = _wire_dtype(dtype, reducing)
    return hit


def _wire_dtype(dtype, reducing: bool):
    if reducing and dtype in _WIDEN:
        return DataType.int32, 1, _WIDEN[dtype]
    dt = _NATIVE.get(dtype)
    if dt is not None:
        return dt, (2 if dtype.is_complex else 1), None
    if reducing:
        raise UnsupportedError(f"harp cannot reduce tensors of dtype {dtype}")
    # Pure data movement: bytes.
    return DataType.uint8, torch.empty((), dtype=dtype).element_size(), None


def check_device(t: torch.Tensor, op: str):
    if t.is_cpu:
        return
    d = t.device.type
    if d == "cpu":
        return
    if d == "cuda":
        if not torch.cuda.is_available():
            raise UnsupportedError(f"harp {op}: CUDA tensor given but CUDA is not available in this process")
        return
    raise UnsupportedError(f"harp {op}: tensors on device '{d}' are not supported (cpu and cuda only)")


class Staged:
    """A host, contiguous view of `t` that HARP can read/write by address."""

    __slots__ = ("orig", "host", "write_back", "stream", "dt", "mult")

    def __init__(self, t: torch.Tensor, *, read: bool, write: bool, reducing: bool = False, op: str = ""):
        if t.layout != torch.strided:
            raise UnsupportedError(f"harp {op}: {t.layout} tensors are not supported (dense tensors only)")
        self.orig = t
        self.dt, self.mult, widen = wire_dtype(t.dtype, reducing)
        self.stream = None
        self.write_back = False
        if not t.is_cpu:
            check_device(t, op)
            self.stream = torch.cuda.current_stream(t.device)
            host = torch.empty(t.shape, dtype=widen or t.dtype, pin_memory=True)
            if read:
                host.copy_(t)  # synchronous on the current stream: the data is on the host after this
            self.host = host
            self.write_back = write
        elif widen is not None:
            self.host = t.to(widen, memory_format=torch.contiguous_format) if read else torch.empty(
                t.shape, dtype=widen)
            self.write_back = write
        elif t.is_contiguous():
            self.host = t
        else:
            self.host = t.contiguous() if read else torch.empty(t.shape, dtype=t.dtype)
            self.write_back = write

    @property
    def ptr(self) -> int:
        return self.host.data_ptr() if self.host.numel() else 0

    @property
    def count(self) -> int:
        return self.host.numel() * self.mult

    def finish(self):
        if not self.write_back:
            return
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                self.orig.copy_(self.host, non_blocking=True)
                # The pinned buffer must outlive the copy: keep it referenced until the stream passes this point.
                ev = torch.cuda.Event()
                ev.record(self.stream)
            ev.synchronize()
        else:
            self.orig.copy_(self.host)
