"""harp.horovod.torch's functions (the package re-exports them: `import harp.horovod.torch as hvd`).

The package's __init__ only gathers names; this module holds the state (the communicator, async
handles) and the calls, so the helpers beside it (_optimizer, elastic, _join) import it one way.
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import pickle
import socket
import weakref

import numpy as np
import torch

import harp
from harp._buffers import torch_cpu_view
from harp.errors import HarpError, InvalidArgumentError

from . import _join
from ._compression import Compression  # noqa: F401  (hvd.Compression)
from ._names import (  # noqa: F401  (hvd's names)
    Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min, Product, Sum, _OP_NAME)

_state = {"comm": None, "owned": False}
_handles: dict = {}
_next_handle = itertools.count(1)


def init(comm=None, process_sets=None, join=False):
    """Join the job: harp.init() from the launcher's environment, or adopt a harp.Communicator.
    join=True (the same on every rank) lets hvd.join() stand in for ranks that ran out of data, at the cost
    of one small control allreduce per collective (see _join.py)."""
    if process_sets:
        raise NotImplementedError("harp.horovod: process sets other than the global one are not provided")
    if _state["comm"] is not None:
        return
    if comm is not None and not isinstance(comm, harp.Communicator):
        raise NotImplementedError("harp.horovod.init(comm=...): pass a harp.Communicator (MPI communicators and "
                                  "rank lists are not provided)")
    c = comm if comm is not None else harp.init()
    host = int.from_bytes(hashlib.sha256(socket.gethostname().encode()).digest()[:8], "little") >> 1
    hosts = c.allgather(np.array([host], np.int64)).reshape(-1).tolist()
    local = [r for r in range(c.size) if hosts[r] == host]
    order = list(dict.fromkeys(hosts))  # hosts in order of their first rank
    _state.update(comm=c, owned=comm is None, local_rank=local.index(c.rank), local_size=len(local),
                  cross_rank=order.index(host))
    _state["cross_size"] = sum(1 for h in order if sum(1 for x in hosts if x == h) > _state["local_rank"])
    _join.enable(join)


def shutdown():
    c, _state["comm"] = _state["comm"], None
    _handles.clear()
    _join.enable(False)
    if c is not None and _state["owned"]:
        c.destroy()


def is_initialized():
    return _state["comm"] is not None


def _comm():
    c = _state["comm"]
    if c is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return c


def rank():
    return _comm().rank


def size():
    return _comm().size


def local_rank():
    _comm()
    return _state["local_rank"]


def local_size():
    _comm()
    return _state["local_size"]


def cross_rank():
    _comm()
    return _state["cross_rank"]


def cross_size():
    _comm()
    return _state["cross_size"]


def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def gloo_enabled():
    return False


def nccl_built():
    return 0


def _cpu(t, what):
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise InvalidArgumentError(f"{what}: tensor on {t.device}; harp.horovod serves CPU tensors")
    if t.is_sparse:
        raise InvalidArgumentError(f"{what}: sparse tensors are not provided (densify: sparse_as_dense)")
    return t


def _reducible(t):
    """(numpy view of contiguous t, harp dtype name or None) for a reduction."""
    return torch_cpu_view(t)


def _raw(t):
    """uint8 numpy view of contiguous t, for data movement (any dtype)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _resolve_op(average, op, what):
    if average is not None and op is not None:
        raise ValueError(f"{what}: the op parameter supersedes average; give only one")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise NotImplementedError(f"{what}: Adasum is not provided by harp.horovod")
    if op not in _OP_NAME:
        raise ValueError(f"{what}: unknown op {op!r} (hvd.Average, Sum, Min, Max, Product)")
    return op


class _AllOf:
    """Several HARP works as one (a grouped call's per-dtype allreduces): done when all are."""

    def __init__(self, works):
        self._works = works

    def test(self):
        return all(w.test() for w in self._works)

    def wait(self):
        for w in self._works:
            w.wait()


def _new_handle(work, finish):
    h = next(_next_handle)
    _handles[h] = (work, finish)
    return h


def poll(handle):
    """True when the asynchronous operation `handle` has finished (never blocks)."""
    if handle not in _handles:
        raise ValueError(f"unknown or already synchronized handle {handle!r}")
    work = _handles[handle][0]
    return work.test()


def synchronize(handle):
    """Wait for `handle` and return its output (as Horovod: the tensor, or (tensor, splits) for alltoall)."""
    try:
        work, finish = _handles.pop(handle)
    except KeyError:
        raise ValueError(f"unknown or already synchronized handle {handle!r}") from None
    try:
        work.wait()
    except HarpError as e:
        raise HorovodInternalError(str(e)) from e
    return finish()


# -- allreduce ------------------------------------------------------------------------------------
def _allreduce_start(t, out, op, prescale, postscale):
    """Reduce t into out (which may be t); a non-contiguous out is reduced in a contiguous copy."""
    buf = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    if buf is not t:
        buf.copy_(t)
    if prescale != 1.0:
        buf.mul_(prescale)
    arr, dt = _reducible(buf.detach())
    work = _join.allreduce(_comm(), arr, _OP_NAME[op], dt, buf, op)

    def finish():
        if postscale != 1.0:
            buf.mul_(postscale)
        if buf is not out:
            out.copy_(buf)
        return out
    return _new_handle(work, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    _cpu(tensor, "allreduce")
    op = _resolve_op(average, op, "allreduce")
    return _allreduce_start(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format), op,
                            prescale_factor, postscale_factor)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    _cpu(tensor, "allreduce_")
    op = _resolve_op(average, op, "allreduce_")
    return _allreduce_start(tensor, tensor, op, prescale_factor, postscale_factor)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """A new tensor: the reduction of `tensor` over every rank (default: the average)."""
    compressed, ctx = compression.compress(tensor)
    h = allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor)
    return compression.decompress(synchronize(h), ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """One HARP allreduce per dtype over the concatenated tensors (tensor fusion); in place."""
    tensors = [_cpu(t, "grouped_allreduce") for t in tensors]
    op = _resolve_op(average, op, "grouped_allreduce")
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    starts = []
    for dt in sorted(by_dtype, key=str):  # the same order on every rank
        idx = by_dtype[dt]
        flat = torch.cat([tensors[i].reshape(-1) for i in idx]) if idx else None
        starts.append((idx, flat, _allreduce_start(flat, flat, op, prescale_factor, postscale_factor)))

    def finish():
        for idx, flat, h in starts:
            synchronize(h)
            off = 0
            for i in idx:
                n = tensors[i].numel()
                tensors[i].copy_(flat[off:off + n].view_as(tensors[i]))
                off += n
        return tensors
    return _new_handle(_AllOf([_handles[h][0] for _, _, h in starts]), finish)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    pairs = [compression.compress(t) for t in tensors]
    out = synchronize(grouped_allreduce_async([p[0] for p in pairs], average, name, op, prescale_factor,
                                              postscale_factor))
    return [compression.decompress(o, p[1]) for o, p in zip(out, pairs)]


# -- allgather, broadcast, alltoall, barrier ------------------------------------------------------
_META = 10  # first dim, ndim, up to 8 trailing dims


def _shape_meta(t, what):
    shape = tuple(t.shape) if t.dim() else (1,)
    if len(shape) > _META - 1:
        raise InvalidArgumentError(f"{what}: tensors of more than {_META - 1} dimensions are not provided")
    m = np.zeros(_META, np.int64)
    m[0], m[1] = shape[0], len(shape)
    m[2:1 + len(shape)] = shape[1:]
    return shape, m


def allgather_async(tensor, name=None, process_set=None):
    _cpu(tensor, "allgather")
    c = _comm()
    _join.guard(c, "allgather")
    shape, meta = _shape_meta(tensor, "allgather")
    metas = c.allgather(meta)
    bad = [r for r in range(c.size) if not np.array_equal(metas[r, 1:], meta[1:])]
    if bad:
        raise InvalidArgumentError(
            f"allgather: rank {c.rank} has shape {shape} but rank(s) {bad} differ beyond the first dimension "
            f"(first rank's shape {tuple(metas[bad[0], 2:1 + metas[bad[0], 1]])} after its first dimension)")
    firsts = metas[:, 0].tolist()
    top = max(firsts)
    padded = torch.zeros((top,) + shape[1:], dtype=tensor.dtype)
    padded[:shape[0]] = tensor.reshape(shape)
    recv = torch.empty((c.size * top,) + shape[1:], dtype=tensor.dtype)
    work = c.allgather(_raw(padded), _raw(recv), async_op=True)

    def finish():
        return torch.cat([recv[r * top:r * top + firsts[r]] for r in range(c.size)])
    return _new_handle(work, finish)


def allgather(tensor, name=None, process_set=None):
    """Every rank's tensor concatenated along dimension 0 (first dimensions may differ)."""
    return synchronize(allgather_async(tensor, name))


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    _cpu(tensor, "broadcast_")
    buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    _join.guard(_comm(), "broadcast")
    work = _comm().broadcast(_raw(buf.detach()), root=root_rank, async_op=True)

    def finish():
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor
    return _new_handle(work, finish)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    _cpu(tensor, "broadcast")
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    return synchronize(broadcast_async_(tensor, root_rank, name))


def broadcast(tensor, root_rank, name=None, process_set=None):
    """A new tensor holding root_rank's `tensor` on every rank."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Scatter dimension-0 slices of `tensor` (splits[i] rows to rank i; equal when None) and gather what
    every rank sent here. Returns (output, received_splits), as Horovod >= 0.21 does."""
    _cpu(tensor, "alltoall")
    c = _comm()
    _join.guard(c, "alltoall")
    t = tensor.contiguous() if tensor.dim() else tensor.reshape(1)
    rows = t.shape[0]
    if splits is None:
        if rows % c.size:
            raise InvalidArgumentError(f"alltoall: {rows} rows do not split evenly over {c.size} ranks; give splits")
        splits = [rows // c.size] * c.size
    splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(splits) != c.size or min(splits) < 0 or sum(splits) != rows:
        raise InvalidArgumentError(f"alltoall: splits {splits} must be {c.size} non-negative numbers summing to {rows}")
    row = int(np.prod(t.shape[1:], dtype=np.int64)) * t.element_size()
    got = c.alltoall(np.array(splits, np.int64))
    recv = torch.empty((int(got.sum()),) + tuple(t.shape[1:]), dtype=t.dtype)
    c.alltoallv(_raw(t), [s * row for s in splits], _raw(recv), [int(g) * row for g in got])
    return recv, torch.from_numpy(got.astype(np.int32))


def barrier(process_set=None):
    _join.guard(_comm(), "barrier")
    _comm().barrier()


def join(device=-1):
    """This rank has finished its data: until every rank has joined, contribute zeros to the allreduces the
    others start (needs hvd.init(join=True) unless all ranks join at the same point). Blocks until all have
    joined; returns the rank that joined last (the same on every rank). See _join.py."""
    return _join.join(_comm())


# -- objects, parameters, optimizer state ---------------------------------------------------------
# Pickles travel sealed: an HMAC-SHA256 under a key from the communicator's token (Communicator.payload_mac)
# over the call's number on this communicator and the bytes; what fails it is refused before unpickling,
# so bytes written by an on-path injector without the token cannot run code here (SECURITY.md).
_MAC = 32
_object_calls = weakref.WeakKeyDictionary()  # communicator -> object calls made on it (the same on every rank)


def _seal_label(c, what):
    n = _object_calls.get(c, 0) + 1
    _object_calls[c] = n
    return f"hvd.{what}#{n}"


def _unseal(c, label, blob, what, src):
    if len(blob) < _MAC or not hmac.compare_digest(bytes(blob[-_MAC:]), c.payload_mac(label, bytes(blob[:-_MAC]))):
        raise InvalidArgumentError(f"{what}: the payload from rank {src} fails its MAC (not sent by a rank of "
                                   "this communicator, or altered on the way); refused, nothing unpickled")
    return pickle.loads(bytes(blob[:-_MAC]))


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's object on every rank (pickled, and sealed with a MAC that every receiver checks before it
    unpickles: see _unseal)."""
    c = _comm()
    _join.guard(c, "broadcast_object")
    label = _seal_label(c, "broadcast_object")
    if c.rank == root_rank:
        data = pickle.dumps(obj)
        data += c.payload_mac(label, data)
    else:
        data = b""
    n = np.array([len(data)], np.int64)
    c.broadcast(n, root=root_rank)
    buf = np.frombuffer(data, np.uint8).copy() if c.rank == root_rank else np.empty(int(n[0]), np.uint8)
    c.broadcast(buf, root=root_rank)
    return obj if c.rank == root_rank else _unseal(c, label, buf.tobytes(), "broadcast_object", root_rank)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's object, in rank order (pickled and sealed as in broadcast_object)."""
    c = _comm()
    _join.guard(c, "allgather_object")
    label = _seal_label(c, "allgather_object")
    raw = pickle.dumps(obj)
    data = np.frombuffer(raw + c.payload_mac(label, raw), np.uint8)
    sizes = c.allgather(np.array([data.size], np.int64)).reshape(-1)
    top = int(sizes.max())
    padded = np.zeros(top, np.uint8)
    padded[:data.size] = data
    allv = c.allgather(padded)
    return [_unseal(c, label, allv[r, :sizes[r]].tobytes(), "allgather_object", r) for r in range(c.size)]


def _named(params):
    if isinstance(params, dict):
        return sorted(params.items())
    params = list(params)
    if params and isinstance(params[0], tuple):
        return params
    return list(enumerate(params))


def broadcast_parameters(params, root_rank):
    """Overwrite every tensor of a state_dict / named_parameters / parameter list with root_rank's values
    (one fused broadcast per dtype)."""
    named = [(k, v) for k, v in _named(params) if isinstance(v, torch.Tensor)]
    groups: dict = {}
    for _, v in named:
        _cpu(v, "broadcast_parameters")
        groups.setdefault(v.dtype, []).append(v)
    for dt in sorted(groups, key=str):
        ts = groups[dt]
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        broadcast_(flat, root_rank)
        off = 0
        with torch.no_grad():
            for t in ts:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()


def broadcast_optimizer_state(optimizer, root_rank):
    """Give every rank root_rank's optimizer state (hyperparameters and per-parameter state)."""
    sd = broadcast_object(optimizer.state_dict() if rank() == root_rank else None, root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(sd)
