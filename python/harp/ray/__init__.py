"""harp.ray: HARP as a backend of Ray's collective library, and under Ray Train.

    import harp.ray, ray.util.collective as col
    harp.ray.register()                       # on the driver and in every actor (Ray's rule)
    col.init_collective_group(world_size=4, rank=r, backend="harp", group_name="g")   # in each actor
    col.allreduce(t, group_name="g")          # numpy arrays or CPU torch tensors, in place

    # Ray Train: the torch backend string reaches init_process_group in the workers
    TorchTrainer(train_fn, torch_config=TorchConfig(backend="harp"), scaling_config=...)

`register()` adds the HARP backend to `ray.util.collective`'s registry
(`register_collective_backend("HARP", HarpGroup)`; calling it again is a no-op).
HarpGroup serves allreduce, reduce, broadcast, allgather, reducescatter, barrier,
send and recv on numpy arrays and CPU torch tensors (every dtype HARP reduces;
bfloat16 tensors too), one HARP communicator per group.

Rendezvous: rank 0 creates a HARP unique id bound to its node's address and
publishes it in Ray's internal key-value store (the GCS) under a key named for
the group; the other ranks poll it (HARP_TIMEOUT, default 300 s) and join; rank 0
deletes the key once the communicator is formed. The unique id carries the
group's random secret, so whoever can read the GCS can join the group: that is
anyone who can already run code on the Ray cluster. Ray Train needs nothing from
this module: installed, HARP's `torch.backends` entry point makes
`init_process_group("harp")` work in every worker.

Threading: like the other Ray backends, one group object per process and group
name; calls on a group are issued by the actor's thread in the same order on
every rank.
"""
from __future__ import annotations

import time

import numpy as np

import harp
from harp import _params
from harp._buffers import torch_cpu_view
from harp.errors import HarpError

KEY_PREFIX = "harp_collective_uid_"


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _view(t, what):
    """(numpy view, harp dtype name or None) of a numpy array or a contiguous CPU torch tensor."""
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise harp.InvalidArgumentError(f"{what}: the numpy array is not C-contiguous")
        return t, None
    torch = _torch()
    if torch is not None and isinstance(t, torch.Tensor):
        if t.device.type != "cpu":
            raise harp.InvalidArgumentError(f"{what}: tensor on {t.device}; the HARP Ray backend serves CPU tensors")
        if not t.is_contiguous():
            raise harp.InvalidArgumentError(f"{what}: the tensor is not contiguous")
        return torch_cpu_view(t)
    raise harp.InvalidArgumentError(f"{what}: expected a numpy array or a CPU torch tensor, got {type(t).__name__}")


def _one(tensors, what):
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
        raise harp.InvalidArgumentError(f"{what}: the HARP backend takes exactly one tensor per process "
                                        "(no multi-GPU lists)")
    return tensors[0]


def _timeout(opts):
    ms = getattr(opts, "timeout_ms", None)
    s = ms.total_seconds() if hasattr(ms, "total_seconds") else (ms / 1000.0 if ms else -1)
    return s if s and s > 0 else None


def _make_group_class():
    from ray.util.collective.collective_group.base_collective_group import BaseGroup
    from ray.util.collective.types import ReduceOp

    ops = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}

    class HarpGroup(BaseGroup):
        """One HARP communicator per Ray collective group (see harp.ray)."""

        def __init__(self, world_size, rank, group_name):
            super().__init__(world_size, rank, group_name)
            self._comm = _rendezvous(world_size, rank, group_name)

        @classmethod
        def backend(cls):
            return "HARP"

        @classmethod
        def check_backend_availability(cls) -> bool:
            return True

        def destroy_group(self):
            if self._comm is not None:
                self._comm.destroy()
                self._comm = None

        def allreduce(self, tensor, allreduce_options=None):
            t = _one(tensor, "allreduce")
            arr, dt = _view(t, "allreduce")
            op = ops[getattr(allreduce_options, "reduceOp", ReduceOp.SUM)]
            self._comm.allreduce(arr, op=op, dtype=dt, timeout=_timeout(allreduce_options))

        def barrier(self, barrier_options=None):
            self._comm.barrier(timeout=_timeout(barrier_options))

        def reduce(self, tensor, reduce_options=None):
            arr, dt = _view(_one(tensor, "reduce"), "reduce")
            op = ops[getattr(reduce_options, "reduceOp", ReduceOp.SUM)]
            self._comm.reduce(arr, op=op, root=int(getattr(reduce_options, "root_rank", 0)), dtype=dt,
                              timeout=_timeout(reduce_options))

        def broadcast(self, tensor, broadcast_options=None):
            arr, dt = _view(_one(tensor, "broadcast"), "broadcast")
            self._comm.broadcast(arr, root=int(getattr(broadcast_options, "root_rank", 0)), dtype=dt,
                                 timeout=_timeout(broadcast_options))

        def allgather(self, tensor_lists, tensor, allgather_options=None):
            outs = _one(tensor_lists, "allgather")
            src, dt = _view(_one(tensor, "allgather"), "allgather")
            if len(outs) != self.world_size:
                raise harp.InvalidArgumentError(f"allgather: {len(outs)} output tensors for {self.world_size} ranks")
            views = [_view(o, "allgather output")[0] for o in outs]
            if any(v.nbytes != src.nbytes for v in views):
                raise harp.InvalidArgumentError("allgather: every output tensor must have the input's size")
            flat = np.empty((self.world_size,) + src.shape, src.dtype)
            self._comm.allgather(src, flat, dtype=dt, timeout=_timeout(allgather_options))
            for v, block in zip(views, flat):
                v.reshape(-1)[...] = block.reshape(-1)

        def reducescatter(self, tensor, tensor_lists, reducescatter_options=None):
            out, dt = _view(_one(tensor, "reducescatter"), "reducescatter")
            ins = [_view(x, "reducescatter input")[0] for x in _one(tensor_lists, "reducescatter")]
            if len(ins) != self.world_size or any(x.nbytes != out.nbytes or x.dtype != out.dtype for x in ins):
                raise harp.InvalidArgumentError(f"reducescatter: needs {self.world_size} input tensors of the "
                                                "output's size and dtype")
            send = np.concatenate([x.reshape(-1) for x in ins])
            op = ops[getattr(reducescatter_options, "reduceOp", ReduceOp.SUM)]
            self._comm.reduce_scatter(send, out.reshape(-1), op=op, dtype=dt,
                                      timeout=_timeout(reducescatter_options))

        def send(self, tensor, send_options):
            arr, dt = _view(_one(tensor, "send"), "send")
            self._comm.send(arr, int(send_options.dst_rank), dtype=dt, timeout=_timeout(send_options))

        def recv(self, tensor, recv_options):
            arr, dt = _view(_one(tensor, "recv"), "recv")
            self._comm.recv(arr, int(recv_options.src_rank), dtype=dt, timeout=_timeout(recv_options))

    return HarpGroup


def _rendezvous(world_size, rank, group_name):
    import ray
    import ray.experimental.internal_kv as kv

    key = KEY_PREFIX + group_name
    wait_s = float(_params.get("HARP_TIMEOUT"))
    if rank == 0:
        uid = harp.get_unique_id(f"{ray.util.get_node_ip_address()}:0")
        kv._internal_kv_put(key, uid.hex(), overwrite=True)
    else:
        deadline = time.monotonic() + wait_s
        while True:
            h = kv._internal_kv_get(key)
            if h is not None:
                uid = harp.UniqueId.from_hex(h.decode())
                break
            if time.monotonic() > deadline:
                raise HarpError(f"harp.ray: rank {rank} of group '{group_name}' waited {wait_s:g} s for rank 0 "
                                f"to publish the group's unique id (is rank 0 running?)")
            time.sleep(0.05)
    comm = harp.Communicator(rank, world_size, uid)
    comm.barrier()
    if rank == 0:
        kv._internal_kv_del(key)
    return comm


_registered = None


def register():
    """Register HARP with ray.util.collective in this process (driver and actors); returns the group class."""
    global _registered
    if _registered is None:
        from ray.util.collective.backend_registry import register_collective_backend

        cls = _make_group_class()
        try:
            register_collective_backend("HARP", cls)
        except ValueError:  # registered earlier in this process by another import of this module
            pass
        _registered = cls
    return _registered
