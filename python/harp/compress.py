"""harp.compress — wire compression for float32 sum/avg allreduce.

Usage::

    comm.allreduce(x, compress="fp16")                 # fp16 on the wire, float32 sums
    comm.allreduce(x, compress="bf16!")                # '!' forces it (skips the gate)
    comm.allreduce(g, compress="topk:0.01,ef", key="layer3")   # top-k 1%, error feedback
    harp.compress.stats(comm)      # {'bytes_sent', 'compressed_calls', 'dense_calls', ...}
    harp.compress.residual(comm, "layer3")   # the key's residual (numpy float32 copy)
    harp.compress.clear(comm)      # drop every residual (or one key)

Specs: ``none``, ``fp16``, ``bf16``, ``topk:RATIO`` (0 < RATIO < 1) or ``topk:K``
(an integer K >= 1 elements per rank), ``,ef`` for top-k error feedback, a
trailing ``!`` to force. Without ``compress=`` a call takes HARP_COMPRESS (the
same switch acts on the torch backend and the NCCL API); ``compress="none"``
turns it off for one call. Only float32 sum/avg allreduce is compressed; any
other dtype, op or collective runs dense.

The gate (core/compress/compress.h) compresses only where the cost model predicts a
win, never for tensors below HARP_COMPRESS_MIN_BYTES, and never when every
rank shares one host (loopback, shm) unless HARP_COMPRESS_INTRA=same; a
forced spec or HARP_COMPRESS_FORCE=1 skips it. HARP_DEBUG=INFO logs each
decision with the predicted dense and compressed times.

Results are identical on every rank and run to run. fp16/bf16 error per
element is bounded by :func:`error_bound`. Top-k keys name the tensor (or
DDP bucket) whose residual is kept; without a key the output buffer's address
and length name it. Ranks that disagree about the compression of a call get
MismatchError.

Threading: like the communicator's other calls.
"""
from __future__ import annotations

import numpy as np

from . import _harp
from ._buffers import address, as_array, out_buffer
from ._types import parse_op, typed_count
from ._work import Work, _seconds
from .errors import InvalidArgumentError

UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
SUBNORMAL_HALF_STEP = {"fp16": 2.0 ** -25, "bf16": 0.0}


def spec_text(spec: str) -> str:
    """The canonical text of a spec (raises InvalidArgumentError for a bad one)."""
    return _harp.compress_spec(str(spec))


def error_bound(abs_sum, ranks: int, kind: str):
    """Largest |result - exact sum| of an fp16/bf16 wire allreduce, per element.

    abs_sum: sum over ranks of |x_i| (array or scalar). There are `ranks`
    roundings to the narrow type (each partial sum once before it travels, the
    final sum once by its owner), each at most u*|partial| + h with |partial| <=
    abs_sum, and ranks-1 float32 additions, each at most 2^-24*|partial|; the
    factor (1 + 2*ranks*u) covers partials grown by earlier errors.
    """
    u, h = UNIT_ROUNDOFF[kind], SUBNORMAL_HALF_STEP[kind]
    s = np.asarray(abs_sum, dtype=np.float64)
    return (ranks * (u * s + h) + (ranks - 1) * 2.0 ** -24 * s) * (1 + 2 * ranks * u)


def topk_bytes(count: int, ranks: int, spec: str) -> int:
    """Bytes one rank sends in a top-k allreduce of `count` elements: (p-1) * 8k."""
    text = spec_text(spec).rstrip("!").split(",")[0]
    arg = float(text.split(":")[1])
    k = int(arg) if arg >= 1 else int(round(arg * count))
    k = min(max(k, 1), count)
    return (ranks - 1) * 8 * k


def allreduce(comm, sendbuf, recvbuf=None, op="sum", *, compress="none", key=None, dtype=None, async_op=False,
              algo=None, timeout=None):
    """comm.allreduce with an explicit compression spec (see the module doc)."""
    code = parse_op(op)
    send = as_array(sendbuf, "allreduce: sendbuf", writable=recvbuf is None)
    dt, n = typed_count(send, dtype, "allreduce: sendbuf")
    out = send if recvbuf is None else out_buffer(recvbuf, send, dtype, n, "allreduce")
    result = recvbuf if recvbuf is not None else sendbuf
    if key is not None and not isinstance(key, str):
        raise InvalidArgumentError(f"allreduce: key must be a str, got {type(key).__name__}")
    secs = _seconds(timeout)
    calls = comm.calls
    calls.settle()
    w = _harp.compress_submit(calls.core, address(send), address(out), int(n), int(dt), int(code), str(compress),
                              key or "", algo or "", secs, bool(async_op))
    keep = (sendbuf, recvbuf, send, out)
    if async_op:
        calls.hold(w, keep)
        return Work(w, result, keep)
    return result


def stats(comm) -> dict:
    """Counters of `comm` (a harp.Communicator): bytes_sent by compressed algorithms (this rank's
    sends), compressed_calls and dense_calls (gate decisions), residual_bytes, default (HARP_COMPRESS)."""
    return dict(_harp.compress_stats(_raw(comm)))


def residual(comm, key: str) -> np.ndarray:
    """A copy of the top-k error-feedback residual kept for `key` (empty when none)."""
    return np.frombuffer(_harp.compress_residual(_raw(comm), str(key)), dtype=np.float32).copy()


def clear(comm, key: str | None = None):
    """Drop the residual of `key`, or every residual of `comm`."""
    _harp.compress_clear(_raw(comm), key or "")


def _raw(comm):
    return getattr(comm, "_c", comm)


__all__ = ["allreduce", "stats", "residual", "clear", "error_bound", "topk_bytes", "spec_text"]
