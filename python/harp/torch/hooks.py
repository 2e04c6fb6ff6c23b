"""harp.torch.hooks — DDP communication hooks with HARP wire compression.

Usage::

    from harp.torch import hooks
    model = DDP(model)                         # process group backend "harp"
    model.register_comm_hook(hooks.HookState(), hooks.fp16_wire_hook)     # or bf16_wire_hook
    model.register_comm_hook(hooks.HookState(compress="topk:0.01,ef"), hooks.topk_hook)

fp16/bf16: the bucket travels in the narrow type while the sum is accumulated
in float32 (unlike torch's fp16_compress_hook, which sums in fp16); topk: the
top-k entries per rank with error feedback, the residual kept by HARP per
bucket index (HookState.clear() drops them). Gradients come back averaged,
as DDP's default hook does. The gate (harp.compress) still decides per bucket
unless the spec ends in '!' (HookState(force=True) adds it); non-float32
buckets go dense. torch's own hooks (fp16_compress_hook, PowerSGD) keep
working on "harp" too.

Threading: DDP calls a hook from its autograd thread, one bucket at a time,
in the same order on every rank; the hook runs the allreduce on that thread
and returns a completed Future (no overlap of a bucket's allreduce with the
backward pass of later buckets — the same as HARP's blocking path).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import compress as _compress


def _harp_communicator(pg):
    """The harp.Communicator running the collectives of process group `pg` (None: WORLD)."""
    from ._pg import ProcessGroupHarp
    pg = pg or dist.group.WORLD
    if isinstance(pg, ProcessGroupHarp):
        return pg.communicator
    try:
        b = pg._get_backend(torch.device("cpu"))
    except Exception as e:  # noqa: BLE001 - explained below
        raise RuntimeError(f"harp.torch.hooks: the process group has no CPU backend ({e})") from None
    if not isinstance(b, ProcessGroupHarp):
        raise RuntimeError(f"harp.torch.hooks: the process group's backend is {type(b).__name__}, not harp")
    return b.communicator


class HookState:
    """What a harp hook needs: the process group (None: WORLD), the compression spec and a
    key prefix for top-k residuals (one residual per bucket index)."""

    def __init__(self, process_group=None, compress: str | None = None, force: bool = False,
                 key_prefix: str = "ddp-bucket"):
        self.process_group = process_group
        self.compress = compress
        self.force = force
        self.key_prefix = key_prefix
        self._comm = None

    def comm(self):
        if self._comm is None:
            self._comm = _harp_communicator(self.process_group)
        return self._comm

    def spec(self, default: str) -> str:
        s = self.compress or default
        return s + "!" if self.force and not s.endswith("!") else s

    def clear(self):
        """Drop every top-k residual of this state's communicator."""
        _compress.clear(self.comm())


def _run(state: HookState, bucket, spec: str):
    buf = bucket.buffer()
    comm = state.comm()
    arr = buf.detach().numpy()
    comm.allreduce(arr, op="avg", compress=spec, key=f"{state.key_prefix}{bucket.index()}")
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def fp16_wire_hook(state: HookState, bucket):
    """Bucket allreduce (average) with fp16 on the wire, float32 sums."""
    return _run(state, bucket, state.spec("fp16"))


def bf16_wire_hook(state: HookState, bucket):
    """Bucket allreduce (average) with bf16 on the wire, float32 sums."""
    return _run(state, bucket, state.spec("bf16"))


def topk_hook(state: HookState, bucket):
    """Bucket allreduce (average) of each rank's top-k entries with error feedback
    (HookState(compress='topk:RATIO,ef'); default topk:0.01,ef)."""
    return _run(state, bucket, state.spec("topk:0.01,ef"))


__all__ = ["HookState", "fp16_wire_hook", "bf16_wire_hook", "topk_hook"]
