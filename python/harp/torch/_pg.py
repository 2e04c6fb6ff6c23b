"""ProcessGroupHarp: a torch.distributed ProcessGroup implemented over HARP.

Pure Python over harp._harp (no compiling against torch): torch calls these
methods through its ProcessGroup trampoline, from Python (dist.all_reduce...)
and from C++ (DDP's reducer, FSDP, functional collectives).

Communicators (all created collectively at construction, rendezvous through
the c10d Store torch hands us):
  * `_coll`: every collective, in issue order.
  * `_up` / `_down`: point-to-point lanes. A message from a lower to a higher
    rank travels on `_up`, the other way on `_down`. HARP runs a
    communicator's operations one after the other, so with a single queue a
    rank doing isend(peer) then irecv(peer) while the peer does the same would
    wait on each other for messages larger than the kernel's socket buffers;
    with two lanes each direction progresses on its own worker thread.
recv from any source: every send also bumps a counter in the group's Store
(key harp_any/<dst>/<src>/<tag>); an any-source receive waits until some
source's counter exceeds what was already received from it, then receives
from that source on the usual lane.

Threading: ops may be issued from any thread (DDP issues from autograd
threads); issue order on each communicator is the order of the calls, which
torch keeps consistent across ranks. Blocking calls run inline on the
calling thread; async works complete on Completer threads (see _work.py).
"""
from __future__ import annotations

import datetime
import hashlib
import threading
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from .. import _params
from .._types import MAX_TAG, TORCH_NAMES, Coll, DataType, ReduceOp, buffer_elems
from .._types import is_int as _is_int
from ..comm import Communicator
from ..errors import HarpError, InvalidArgumentError
from ._store import TorchStore
from ._sparse import sparse_allreduce
from ._threads import fit_threads
from ._tensors import Staged, UnsupportedError, check_device, harp_op, reduce_op_name
from ._work import Completer, HarpWork, backend_error, completed_work


# torch's timeout rule, kept here: None or negative (c10d's kUnsetTimeout, -1 ms, the default of
# every *Options.timeout) means "unset": the group's timeout; 0 means zero, as in gloo: the call
# fails unless it can finish without waiting. HARP's own API refuses 0 (harp._work._seconds) and
# its core reads <= 0 as "the communicator's", so zero reaches the core as _ZERO_S.
_ZERO_S = 1e-6


def _secs(td) -> float:
    """timedelta (or seconds) -> seconds for the core: unset (None/negative) -> -1; 0 -> _ZERO_S."""
    if td is None:
        return -1.0
    s = td.total_seconds() if hasattr(td, "total_seconds") else float(td)
    if s != s:  # NaN
        raise InvalidArgumentError(f"harp: timeout {td!r} is not a number of seconds")
    return -1.0 if s < 0 else max(s, _ZERO_S)


def _members_key(members) -> str:
    """Store-prefix part naming a group's members (global ranks): "" for none given (the world)."""
    if not members:
        return ""
    return hashlib.sha256(",".join(str(int(r)) for r in members).encode()).hexdigest()[:16] + "/"


def _same_split(sizes):
    return all(s == sizes[0] for s in sizes)



# -- torch.profiler spans ------------------------------------------------------------------------
# One "harp:<op>" span per call while a profiler records (torch.profiler, Kineto's Chrome trace), named
# like torch's own "nccl:all_reduce" plus " bytes=N" (a collective's torch name is vocab.def's torch column,
# TORCH_NAMES; torch's own method names, all_gather_into_tensor, ..., stay as they are); nothing is done when
# none records. The span covers the call (for async calls: the enqueue, as torch's own spans do); the
# algorithm each call ran is in the flight record and the metrics (harp.debug, harp.metrics).


def _span(opname, result):
    nbytes = 0
    for t in result if isinstance(result, (list, tuple)) else (result,):
        for u in t if isinstance(t, (list, tuple)) else (t,):
            if isinstance(u, torch.Tensor):
                nbytes += u.numel() * u.element_size()
    # Kineto's Chrome trace drops record_function's args: the bytes go into the name, after a space,
    # the way torch's "nccl:send 0->1" carries its peers.
    span = torch.profiler.record_function(f"harp:{TORCH_NAMES.get(opname, opname)} bytes={nbytes}")
    span.__enter__()
    return span

class ProcessGroupHarp(dist.ProcessGroup):
    """torch.distributed process group whose collectives run on HARP."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta | None = None,
                 group_name: str = "", other_backends=None, members=None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._store = store
        self._timeout = _secs(timeout)
        self._name = group_name or "harp"
        self._desc = f"rank {rank} of group '{self._name}' ({size} ranks)"
        self._lock = threading.Lock()
        self._closed = False
        hs = TorchStore(store)
        t = None if self._timeout < 0 else self._timeout
        # torch names groups by a counter, so groups with different members can get one name (and one
        # store prefix): new_subgroups(group_size=1, group=sub) under [0,2] and [1,3] names [0] and [1]
        # alike. The members' global ranks keep their rendezvous apart.
        mid = _members_key(members)
        try:
            self._coll = Communicator.from_store(hs, rank, size, prefix=f"harp/c/{mid}", timeout=t)
            if size > 1:
                self._up = Communicator.from_store(hs, rank, size, prefix=f"harp/up/{mid}", timeout=t)
                self._down = Communicator.from_store(hs, rank, size, prefix=f"harp/down/{mid}", timeout=t)
            else:
                self._up = self._down = None
        except HarpError as e:
            raise dist.DistBackendError(f"harp: creating process group failed on {self._desc}: {e}") from None
        try:
            fit_threads(self._coll)  # once per process: torch threads vs. this host's ranks and cores
        except HarpError as e:
            raise dist.DistBackendError(f"harp: creating process group failed on {self._desc}: {e}") from None
        self._done = {id(self._coll): Completer(f"{self._name}-c")}
        if self._up is not None:
            self._done[id(self._up)] = Completer(f"{self._name}-up")
            self._done[id(self._down)] = Completer(f"{self._name}-down")
        self._anysource = _params.get("HARP_TORCH_ANYSOURCE") != "0"
        self._recvd = {}       # (src, tag) -> messages received from src with tag (for any-source matching)
        self._mb_seq = 0
        # Other devices' backends for mixed specs ("cpu:harp,cuda:nccl"): device type -> c10d Backend
        self._other = dict(other_backends or {})

    # -- identity ------------------------------------------------------------------------------------------
    @property
    def communicator(self):
        """The harp.Communicator that runs this group's collectives (harp.torch.hooks, harp.elastic)."""
        return self._coll

    def getBackendName(self):
        return "harp"

    # torch names groups after creation (pg._set_group_name -> setGroupName); the C++ default keeps the
    # name in the device backends, which a Python group does not have, so keep it here.
    def setGroupName(self, name):
        self._name = name
        self._desc = f"rank {self._rank} of group '{name}' ({self._size} ranks)"

    def setGroupDesc(self, desc):
        self._gdesc = desc

    @property
    def group_name(self):
        return self._name

    @property
    def group_desc(self):
        return getattr(self, "_gdesc", self._name)

    def __repr__(self):
        return f"ProcessGroupHarp(rank={self._rank}, size={self._size}, name={self._name!r})"

    # -- plumbing ------------------------------------------------------------------------------------------
    def _delegate(self, tensors, method, *args):
        """For mixed specs: the other device's backend and the call to run on it, or None."""
        if not self._other or not tensors:
            return None
        b = self._other.get(tensors[0].device.type)
        if b is None:
            return None
        return getattr(b, method)(*args)

    def _lane(self, src: int, dst: int):
        """The communicator carrying messages from src to dst."""
        return self._up if src < dst else self._down

    def _submit(self, comm, coll, send, recv, count, dt, *, op=ReduceOp.SUM, root=0, peer=-1, tag=0,
                timeout=-1.0, v=None):
        sc, sd, rc, rd = v if v is not None else ([], [], [], [])
        # Blocking torch calls run inline on this thread (no hand-off to HARP's worker when it is idle).
        inline = getattr(_tls, "inline", False)
        return comm.calls.core.submit(int(coll), send, recv, int(count), int(dt), int(op), int(root), int(peer),
                                      int(tag), "", float(timeout), not inline, sc, sd, rc, rd)

    def _issue(self, opname, fn, opts, result, staged=(), post=None, comm=None):
        """Run fn() -> list of HARP handles; wrap them in a HarpWork (finished now when not async)."""
        comm = comm or self._coll
        is_async = getattr(opts, "asyncOp", True)
        _tls.inline = not is_async
        span = _span(opname, result) if torch.autograd._profiler_enabled() else None  # profiler span
        try:
            handles = fn()
        except HarpError as e:
            raise backend_error(opname, self._desc, e) from None
        finally:
            _tls.inline = False
            if span is not None:
                span.__exit__(None, None, None)
        w = HarpWork(opname, self._desc, handles, staged, result, post)
        if is_async:
            w.get_future()  # DDP and hooks always ask for it; create it before a completer can finish
            self._done[id(comm)].add(w)
        else:
            w.wait()
        return w

    def _check(self, tensors, opname):
        for t in tensors:
            check_device(t, opname)
            if t.is_sparse:
                raise UnsupportedError(f"harp {opname}: sparse tensors are not supported")

    def _one(self, tensors, opname):
        if len(tensors) != 1:
            raise UnsupportedError(f"harp {opname}: expects exactly one tensor per rank, got {len(tensors)}")
        return tensors[0]

    # Integer arguments torch passes through unchanged (dst, src, tag, rootRank, split sizes,
    # excluded ranks): InvalidArgumentError (a ValueError, as torch's own checks raise) naming the
    # argument, its value and what is allowed.
    def _peer(self, r, what, opname):
        """Another rank's index: an int (not bool or float) in range and not this rank."""
        if not _is_int(r) or not 0 <= r < self._size or r == self._rank:
            raise InvalidArgumentError(f"harp {opname}: {what} {r!r} is not another rank (allowed: 0 to "
                                       f"{self._size - 1} except this rank, {self._rank})")
        return int(r)

    def _tag(self, tag, opname):
        if not _is_int(tag) or not 0 <= tag <= MAX_TAG:
            raise InvalidArgumentError(f"harp {opname}: tag {tag!r} is out of range [0, {MAX_TAG}]")
        return int(tag)

    def _root(self, r, opname):
        if not _is_int(r) or not 0 <= r < self._size:
            raise InvalidArgumentError(f"harp {opname}: root {r!r} is out of range [0, {self._size - 1}]")
        return int(r)

    # -- allreduce -------------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or _c10d.AllreduceOptions()
        d = self._delegate(tensors, "allreduce", tensors, opts)
        if d is not None:
            return d
        t = self._one(tensors, "allreduce")
        if t.is_sparse:  # sparse_coo, as gloo (harp/torch/_sparse.py)
            name, timeout = reduce_op_name(opts.reduceOp), _secs(opts.timeout)

            def run():
                sparse_allreduce(self._coll, t, name, timeout if timeout > 0 else None)  # -1: unset
                return []
            return self._issue("allreduce", run, opts, tensors)
        return self._allreduce_tensor("allreduce", t, opts, tensors)

    def _allreduce_tensor(self, opname, t, opts, result):
        op, factor = harp_op(opts.reduceOp)
        s = Staged(t, read=True, write=True, reducing=True, op=opname)
        if factor is not None:
            s.host.mul_(factor)
            s.write_back = s.host is not t or s.write_back
        timeout = _secs(opts.timeout)
        return self._issue(opname, lambda: [self._submit(self._coll, Coll.allreduce, s.ptr, s.ptr, s.count, s.dt,
                                                         op=op, timeout=timeout)], opts, result, [s])

    def allreduce_coalesced(self, tensors, opts=None):
        # the tensors of each wire dtype (in order of first appearance) go to the core as one
        # list, reduced by one ring schedule over their own memory (allreduce_coalesced in the core): CPU
        # tensors are neither flattened nor copied back; CUDA ones are staged tensor by tensor like a
        # single allreduce's. HARP_COALESCE=fuse flattens each dtype into one tensor (torch.cat), as before.
        opts = opts or _c10d.AllreduceCoalescedOptions()
        d = self._delegate(tensors, "allreduce_coalesced", tensors, opts)
        if d is not None:
            return d
        self._check(tensors, "allreduce_coalesced")
        if not tensors:
            return completed_work("allreduce_coalesced", self._desc, tensors)
        if any(t.device != tensors[0].device for t in tensors):
            raise UnsupportedError("harp allreduce_coalesced: all tensors must be on the same device")
        from ..coalesce import mode as coalesce_mode
        if coalesce_mode() != "fuse":
            return self._allreduce_list(tensors, opts)
        groups = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        flats = [(g, torch.cat([t.reshape(-1) for t in g])) for g in groups.values()]

        def post():
            for g, flat in flats:
                off = 0
                for t in g:
                    n = t.numel()
                    t.copy_(flat[off:off + n].view_as(t))
                    off += n

        op, factor = harp_op(opts.reduceOp)
        staged = [Staged(flat, read=True, write=True, reducing=True, op="allreduce_coalesced") for _, flat in flats]
        if factor is not None:
            for s in staged:
                s.host.mul_(factor)
        timeout = _secs(opts.timeout)
        return self._issue("allreduce_coalesced",
                           lambda: [self._submit(self._coll, Coll.allreduce, s.ptr, s.ptr, s.count, s.dt, op=op,
                                                 timeout=timeout) for s in staged], opts, tensors, staged, post)

    _INTEGER = frozenset({DataType.int8, DataType.uint8, DataType.int32, DataType.uint32, DataType.int64,
                          DataType.uint64})

    def _allreduce_list(self, tensors, opts):
        op, factor = harp_op(opts.reduceOp)
        staged = [Staged(t, read=True, write=True, reducing=True, op="allreduce_coalesced") for t in tensors]
        if factor is not None:
            for s in staged:
                s.host.mul_(factor)
                s.write_back = s.host is not s.orig or s.write_back
        groups = {}
        for s in staged:
            if s.count:
                groups.setdefault(s.dt, []).append(s)
        timeout = _secs(opts.timeout)

        def run():
            async_op = not getattr(_tls, "inline", False)
            handles = []
            for dt, g in groups.items():
                if op == ReduceOp.AVG and dt in self._INTEGER:  # the core's list refuses integer avg
                    handles += [self._submit(self._coll, Coll.allreduce, s.ptr, s.ptr, s.count, dt, op=op,
                                             timeout=timeout) for s in g]
                    continue
                ptrs = [s.ptr for s in g]
                core = self._coll.calls.core
                handles.append(core.submit_coalesced(ptrs, ptrs, [s.count for s in g], int(dt), int(op), "",
                                                     float(timeout), async_op))
            return handles
        return self._issue("allreduce_coalesced", run, opts, tensors, staged)

    # -- broadcast / reduce ------------------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        opts = opts or _c10d.BroadcastOptions()
        d = self._delegate(tensors, "broadcast", tensors, opts)
        if d is not None:
            return d
        t = self._one(tensors, "broadcast")
        root = self._root(opts.rootRank, "broadcast")
        s = Staged(t, read=self._rank == root, write=self._rank != root, op="broadcast")
        timeout = _secs(opts.timeout)
        return self._issue("broadcast", lambda: [self._submit(self._coll, Coll.broadcast, s.ptr, s.ptr, s.count,
                                                              s.dt, root=root, timeout=timeout)], opts, tensors, [s])

    def reduce(self, tensors, opts=None):
        opts = opts or _c10d.ReduceOptions()
        d = self._delegate(tensors, "reduce", tensors, opts)
        if d is not None:
            return d
        t = self._one(tensors, "reduce")
        root = self._root(opts.rootRank, "reduce")
        op, factor = harp_op(opts.reduceOp)
        is_root = self._rank == root
        src = t * factor if factor is not None else t
        s = Staged(src, read=True, write=is_root, reducing=True, op="reduce")
        if is_root and src is not t:
            s.orig, s.write_back = t, True
        timeout = _secs(opts.timeout)
        return self._issue("reduce", lambda: [self._submit(self._coll, Coll.reduce, s.ptr, s.ptr if is_root else 0,
                                                           s.count, s.dt, op=op, root=root, timeout=timeout)],
                           opts, tensors, [s])

    # -- allgather ----------------------------------------------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        d = self._delegate(input_tensors, "allgather", output_tensors, input_tensors, opts)
        if d is not None:
            return d
        inp = self._one(input_tensors, "allgather")
        outs = self._one(output_tensors, "allgather")
        if len(outs) != self._size:
            raise ValueError(f"harp allgather: output list has {len(outs)} tensors, expected {self._size}")
        self._check(outs, "allgather")
        sizes = [o.numel() for o in outs]
        if any(o.dtype != inp.dtype for o in outs):
            raise ValueError("harp allgather: output and input dtypes differ")
        if sizes[self._rank] != inp.numel():
            raise ValueError(f"harp allgather: output slot {self._rank} has {sizes[self._rank]} elements, "
                             f"input has {inp.numel()}")
        return self._gather_into(inp, outs, sizes, opts, "allgather", output_tensors)

    def _gather_into(self, inp, outs, sizes, opts, opname, result):
        s = Staged(inp, read=True, write=False, op=opname)
        flat = torch.empty(sum(sizes), dtype=inp.dtype)
        fs = Staged(flat, read=False, write=False, op=opname)
        timeout = _secs(opts.timeout)
        m = s.mult

        def post():
            off = 0
            for o, n in zip(outs, sizes):
                o.copy_(flat[off:off + n].view_as(o))
                off += n

        def run():
            if _same_split(sizes):
                return [self._submit(self._coll, Coll.allgather, s.ptr, fs.ptr, s.count, s.dt, timeout=timeout)]
            # uneven: alltoallv where every rank sends its whole input to everyone
            counts = [n * m for n in sizes]
            displs = [sum(counts[:i]) for i in range(self._size)]
            return [self._submit(self._coll, Coll.alltoallv, s.ptr, fs.ptr, 0, s.dt, timeout=timeout,
                                 v=([s.count] * self._size, [0] * self._size, counts, displs))]

        return self._issue(opname, run, opts, result, [s], post)

    def all_gather_single(self, output, input, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        d = self._delegate([input], "_allgather_base", output, input, opts)
        if d is not None:
            return d
        _, want = buffer_elems(Coll.allgather, input.numel(), self._size)
        if output.numel() != want:
            raise ValueError(f"harp all_gather_into_tensor: output has {output.numel()} elements, expected "
                             f"{want} ({self._size} ranks x {input.numel()})")
        if output.dtype != input.dtype:
            raise ValueError("harp all_gather_into_tensor: output and input dtypes differ")
        s = Staged(input, read=True, write=False, op="all_gather_into_tensor")
        o = Staged(output, read=False, write=True, op="all_gather_into_tensor")
        timeout = _secs(opts.timeout)
        return self._issue("all_gather_into_tensor",
                           lambda: [self._submit(self._coll, Coll.allgather, s.ptr, o.ptr, s.count, s.dt,
                                                 timeout=timeout)], opts, [output], [s, o])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        works = [self.all_gather_single(o, i, _async_like(opts, _c10d.AllgatherOptions)) for o, i in
                 zip(outputs, inputs)]
        return self._join("all_gather_into_tensor_coalesced", works, opts, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        d = self._delegate(input_list, "allgather_coalesced", output_lists, input_list, opts)
        if d is not None:
            return d
        self._check(input_list, "allgather_coalesced")
        if len(output_lists) != self._size:
            raise ValueError(f"harp allgather_coalesced: {len(output_lists)} output lists, expected {self._size}")
        if any(t.dtype != input_list[0].dtype for t in input_list):
            raise UnsupportedError("harp allgather_coalesced: all tensors must have the same dtype")
        flat_in = torch.cat([t.reshape(-1) for t in input_list])
        n = flat_in.numel()
        flat_out = torch.empty(buffer_elems(Coll.allgather, n, self._size)[1], dtype=flat_in.dtype)
        s = Staged(flat_in, read=True, write=False, op="allgather_coalesced")
        timeout = _secs(opts.timeout)

        def post():
            for r, outs in enumerate(output_lists):
                off = r * n
                for o in outs:
                    k = o.numel()
                    o.copy_(flat_out[off:off + k].view_as(o))
                    off += k

        return self._issue("allgather_coalesced",
                           lambda: [self._submit(self._coll, Coll.allgather, s.ptr, flat_out.data_ptr(), s.count,
                                                 s.dt, timeout=timeout)], opts, output_lists, [s], post)

    # -- reduce_scatter ----------------------------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        d = self._delegate(output_tensors, "reduce_scatter", output_tensors, input_tensors, opts)
        if d is not None:
            return d
        out = self._one(output_tensors, "reduce_scatter")
        ins = self._one(input_tensors, "reduce_scatter")
        if len(ins) != self._size:
            raise ValueError(f"harp reduce_scatter: input list has {len(ins)} tensors, expected {self._size}")
        self._check(ins, "reduce_scatter")
        if any(t.dtype != out.dtype for t in ins):  # the call's datatype is the inputs': it must fit out
            raise ValueError("harp reduce_scatter: output and input dtypes differ")
        sizes = [t.numel() for t in ins]
        if sizes[self._rank] != out.numel():
            raise ValueError(f"harp reduce_scatter: output has {out.numel()} elements, input slot {self._rank} "
                             f"has {sizes[self._rank]}")
        op, factor = harp_op(opts.reduceOp)
        flat = torch.cat([t.reshape(-1) for t in ins])
        if factor is not None:
            flat.mul_(factor)
        fs = Staged(flat, read=True, write=False, reducing=True, op="reduce_scatter")
        timeout = _secs(opts.timeout)
        if _same_split(sizes):
            o = Staged(out, read=False, write=True, reducing=True, op="reduce_scatter")
            return self._issue("reduce_scatter",
                               lambda: [self._submit(self._coll, Coll.reduce_scatter, fs.ptr, o.ptr, o.count, fs.dt,
                                                     op=op, timeout=timeout)], opts, output_tensors, [fs, o])
        # uneven blocks: allreduce everything, keep our block
        off = sum(sizes[:self._rank])

        def post():
            out.copy_(fs.host[off:off + sizes[self._rank]].view_as(out).to(out.dtype))

        return self._issue("reduce_scatter",
                           lambda: [self._submit(self._coll, Coll.allreduce, fs.ptr, fs.ptr, fs.count, fs.dt, op=op,
                                                 timeout=timeout)], opts, output_tensors, [fs], post)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        d = self._delegate([input], "_reduce_scatter_base", output, input, opts)
        if d is not None:
            return d
        want, _ = buffer_elems(Coll.reduce_scatter, output.numel(), self._size)
        if input.numel() != want:
            raise ValueError(f"harp reduce_scatter_tensor: input has {input.numel()} elements, expected "
                             f"{want} ({self._size} ranks x {output.numel()})")
        if output.dtype != input.dtype:
            raise ValueError("harp reduce_scatter_tensor: output and input dtypes differ")
        op, factor = harp_op(opts.reduceOp)
        src = input * factor if factor is not None else input
        s = Staged(src, read=True, write=False, reducing=True, op="reduce_scatter_tensor")
        o = Staged(output, read=False, write=True, reducing=True, op="reduce_scatter_tensor")
        timeout = _secs(opts.timeout)
        return self._issue("reduce_scatter_tensor",
                           lambda: [self._submit(self._coll, Coll.reduce_scatter, s.ptr, o.ptr, o.count, s.dt, op=op,
                                                 timeout=timeout)], opts, [output], [s, o])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        sub = _async_like(opts, _c10d.ReduceScatterOptions)
        sub.reduceOp = opts.reduceOp
        works = [self.reduce_scatter_single(o, i, sub) for o, i in zip(outputs, inputs)]
        return self._join("reduce_scatter_tensor_coalesced", works, opts, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- alltoall ---------------------------------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or _c10d.AllToAllOptions()
        d = self._delegate([input], "alltoall_base", output, input, output_split_sizes, input_split_sizes, opts)
        if d is not None:
            return d
        if output.dtype != input.dtype:
            raise ValueError("harp all_to_all_single: output and input dtypes differ")
        p = self._size
        s = Staged(input, read=True, write=False, op="all_to_all_single")
        o = Staged(output, read=False, write=True, op="all_to_all_single")
        timeout = _secs(opts.timeout)
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % p or output.numel() != input.numel():
                raise ValueError(f"harp all_to_all_single: {input.numel()} input / {output.numel()} output "
                                 f"elements do not split evenly over {p} ranks")
            return self._issue("all_to_all_single",
                               lambda: [self._submit(self._coll, Coll.alltoall, s.ptr, o.ptr, s.count // p, s.dt,
                                                     timeout=timeout)], opts, [output], [s, o])

        def counts(t, splits, what):
            rows = t.shape[0] if t.dim() else 1
            row = (t.numel() // rows if rows else 0) * s.mult
            if not splits:
                if rows % p:
                    raise ValueError(f"harp all_to_all_single: {what} has {rows} rows, not divisible by {p} ranks")
                splits = [rows // p] * p
            if len(splits) != p or any(not _is_int(x) or x < 0 for x in splits) or sum(splits) != rows:
                raise InvalidArgumentError(f"harp all_to_all_single: {what} split sizes {list(splits)} are not "
                                           f"allowed: {p} non-negative integers summing to the {rows} rows")
            c = [int(x) * row for x in splits]
            return c, [sum(c[:i]) for i in range(p)]

        sc, sd = counts(input, input_split_sizes, "input")
        rc, rd = counts(output, output_split_sizes, "output")
        return self._issue("all_to_all_single",
                           lambda: [self._submit(self._coll, Coll.alltoallv, s.ptr, o.ptr, 0, s.dt, timeout=timeout,
                                                 v=(sc, sd, rc, rd))], opts, [output], [s, o])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllToAllOptions()
        d = self._delegate(input_tensors, "alltoall", output_tensors, input_tensors, opts)
        if d is not None:
            return d
        p = self._size
        if len(output_tensors) != p or len(input_tensors) != p:
            raise ValueError(f"harp alltoall: needs {p} input and {p} output tensors")
        self._check(list(output_tensors) + list(input_tensors), "alltoall")
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        rsz = [t.numel() for t in output_tensors]
        flat_out = torch.empty(sum(rsz), dtype=flat_in.dtype)
        s = Staged(flat_in, read=True, write=False, op="alltoall")
        m = s.mult
        sc = [t.numel() * m for t in input_tensors]
        rc = [n * m for n in rsz]
        sd = [sum(sc[:i]) for i in range(p)]
        rd = [sum(rc[:i]) for i in range(p)]
        timeout = _secs(opts.timeout)

        def post():
            off = 0
            for t, n in zip(output_tensors, rsz):
                t.copy_(flat_out[off:off + n].view_as(t))
                off += n

        return self._issue("alltoall",
                           lambda: [self._submit(self._coll, Coll.alltoallv, s.ptr, flat_out.data_ptr(), 0, s.dt,
                                                 timeout=timeout, v=(sc, sd, rc, rd))], opts, output_tensors, [s],
                           post)

    # -- gather / scatter -------------------------------------------------------------------------------------
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.GatherOptions()
        d = self._delegate(input_tensors, "gather", output_tensors, input_tensors, opts)
        if d is not None:
            return d
        inp = self._one(input_tensors, "gather")
        root = self._root(opts.rootRank, "gather")
        s = Staged(inp, read=True, write=False, op="gather")
        timeout = _secs(opts.timeout)
        if self._rank != root:
            return self._issue("gather", lambda: [self._submit(self._coll, Coll.gather, s.ptr, 0, s.count, s.dt,
                                                               root=root, timeout=timeout)], opts, output_tensors, [s])
        outs = self._one(output_tensors, "gather")
        if len(outs) != self._size or any(o.numel() != inp.numel() for o in outs):
            raise ValueError(f"harp gather: the root needs {self._size} output tensors of {inp.numel()} elements")
        n = inp.numel()
        flat = torch.empty(buffer_elems(Coll.gather, n, self._size)[1], dtype=inp.dtype)  # the root's

        def post():
            for r, o in enumerate(outs):
                o.copy_(flat[r * n:(r + 1) * n].view_as(o))

        return self._issue("gather", lambda: [self._submit(self._coll, Coll.gather, s.ptr, flat.data_ptr(), s.count,
                                                           s.dt, root=root, timeout=timeout)],
                           opts, output_tensors, [s], post)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.ScatterOptions()
        d = self._delegate(output_tensors, "scatter", output_tensors, input_tensors, opts)
        if d is not None:
            return d
        out = self._one(output_tensors, "scatter")
        root = self._root(opts.rootRank, "scatter")
        o = Staged(out, read=False, write=True, op="scatter")
        timeout = _secs(opts.timeout)
        send = 0
        keep = []
        if self._rank == root:
            ins = self._one(input_tensors, "scatter")
            if len(ins) != self._size or any(t.numel() != out.numel() for t in ins):
                raise ValueError(f"harp scatter: the root needs {self._size} input tensors of {out.numel()} elements")
            if any(t.dtype != out.dtype for t in ins):  # the call's count and datatype are the output's
                raise ValueError("harp scatter: output and input dtypes differ")
            self._check(ins, "scatter")
            flat = torch.cat([t.reshape(-1).cpu() for t in ins])
            keep.append(Staged(flat, read=True, write=False, op="scatter"))
            send = keep[0].ptr
        return self._issue("scatter", lambda: [self._submit(self._coll, Coll.scatter, send, o.ptr, o.count, o.dt,
                                                            root=root, timeout=timeout)],
                           opts, output_tensors, [o] + keep)

    # -- barrier ----------------------------------------------------------------------------------------------
    def barrier(self, opts=None):
        opts = opts or _c10d.BarrierOptions()
        timeout = _secs(getattr(opts, "timeout", None))
        return self._issue("barrier", lambda: [self._submit(self._coll, Coll.barrier, 0, 0, 0, DataType.uint8,
                                                            timeout=timeout)], opts, [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Rank 0 checks in every rank through the Store and names the ranks that did not arrive in time.

        As gloo's monitoredBarrier, whose words torch's tests match: timeout None (or unset) is the
        group's; 0 is zero. Rank 0 checks the ranks in order; without wait_all_ranks, rank 0 raises
        "Rank 0 timed out in monitoredBarrier after N ms" once its time is up before a rank was
        checked, and "Rank r failed to pass monitoredBarrier in N ms" for the first rank that did not
        arrive; with it, "Ranks a, b failed to pass monitoredBarrier in N ms" for all of them. HARP's
        own text (which ranks, how long, which group) follows; the other ranks raise the same text."""
        secs = _secs(timeout)
        if secs < 0:
            secs = self._timeout if self._timeout > 0 else 1800.0
        ms = int(round(secs * 1000)) if secs > _ZERO_S else 0
        self._mb_seq += 1
        key = f"harp_mb/{self._mb_seq}"
        deadline = time.monotonic() + secs
        if self._rank != 0:
            self._store.set(f"{key}/{self._rank}", b"1")
            try:  # rank 0 reports at its deadline; give its report time to arrive
                self._store.wait([f"{key}/done"], datetime.timedelta(seconds=max(deadline - time.monotonic(), 0) + 10))
            except Exception:
                raise dist.DistBackendError(
                    f"harp monitored_barrier: {self._desc} was not released by rank 0 within {secs + 10:.1f} s "
                    f"(rank 0 is stuck or dead)") from None
            if self._store.get(f"{key}/done") != b"ok":
                raise dist.DistBackendError(f"harp monitored_barrier: rank 0 reported: "
                                            f"{self._store.get(f'{key}/done').decode()}")
            return completed_work("monitored_barrier", self._desc, [])
        missing, passed, msg = [], [], None
        for r in range(1, self._size):
            left = deadline - time.monotonic()
            if left <= 0 and not wait_all_ranks:
                done = (f"Successfully processed ranks: {', '.join(map(str, passed))}" if passed else
                        "No ranks successfully processed in monitoredBarrier")
                msg = (f"Rank 0 timed out in monitoredBarrier after {ms} ms. {done}. (harp: rank(s) "
                       f"{list(range(r, self._size))} not checked in within {secs:.3g} s, group '{self._name}')")
                break
            try:
                self._store.wait([f"{key}/{r}"], datetime.timedelta(seconds=max(left, 0.001)))
                passed.append(r)
            except Exception:
                missing.append(r)
                if not wait_all_ranks:
                    break
        if missing and msg is None:
            who = f"Rank {missing[0]}" if len(missing) == 1 else f"Ranks {', '.join(map(str, missing))}"
            msg = (f"{who} failed to pass monitoredBarrier in {ms} ms: rank(s) {missing} did not reach "
                   f"monitored_barrier within {secs:.3g} s (group '{self._name}')")
        if msg is not None:
            self._store.set(f"{key}/done", msg.encode())
            raise dist.DistBackendError(f"harp monitored_barrier on rank 0: {msg}")
        self._store.set(f"{key}/done", b"ok")
        return completed_work("monitored_barrier", self._desc, [])

    # -- point to point ---------------------------------------------------------------------------------------
    def send(self, tensors, dst, tag=0):
        d = self._delegate(tensors, "send", tensors, dst, tag)
        if d is not None:
            return d
        t = self._one(tensors, "send")
        dst, tag = self._peer(dst, "dst", "send"), self._tag(tag, "send")
        s = Staged(t, read=True, write=False, op="send")
        lane = self._lane(self._rank, dst)
        w = self._issue(f"send to rank {dst}",
                        lambda: [self._submit(lane, Coll.send, s.ptr, 0, s.count, s.dt, peer=dst, tag=tag)],
                        _ASYNC, tensors, [s], comm=lane)
        if self._anysource:
            self._store.add(f"harp_any/{dst}/{self._rank}/{tag}", 1)
        return w

    def recv(self, tensors, src, tag=0):
        d = self._delegate(tensors, "recv", tensors, src, tag)
        if d is not None:
            return d
        t = self._one(tensors, "recv")
        src, tag = self._peer(src, "src", "recv"), self._tag(tag, "recv")
        with self._lock:
            self._recvd[(src, tag)] = self._recvd.get((src, tag), 0) + 1
        w = self._recv_from(t, src, tag, tensors)
        return w

    def _recv_from(self, t, src, tag, result):
        s = Staged(t, read=False, write=True, op="recv")
        lane = self._lane(src, self._rank)
        w = self._issue(f"recv from rank {src}",
                        lambda: [self._submit(lane, Coll.recv, 0, s.ptr, s.count, s.dt, peer=src, tag=tag)],
                        _ASYNC, result, [s], comm=lane)
        w.set_source(src)
        return w

    def recv_anysource(self, tensors, tag=0):
        t = self._one(tensors, "recv_anysource")
        tag = self._tag(tag, "recv_anysource")
        check_device(t, "recv_anysource")
        if not self._anysource:
            raise UnsupportedError("harp recv from any source is disabled (HARP_TORCH_ANYSOURCE=0)")
        secs = self._timeout if self._timeout > 0 else 1800.0
        outer = HarpWork("recv from any source", self._desc, result=tensors)
        state = {}

        def find_source():
            deadline = time.monotonic() + secs
            delay = 0.0005
            while time.monotonic() < deadline:
                for r in range(self._size):
                    if r == self._rank:
                        continue
                    n = self._store.add(f"harp_any/{self._rank}/{r}/{tag}", 0)
                    with self._lock:
                        if n > self._recvd.get((r, tag), 0):
                            self._recvd[(r, tag)] = self._recvd.get((r, tag), 0) + 1
                            return r
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            raise dist.DistBackendError(f"harp recv from any source on {self._desc}: no message with tag {tag} "
                                        f"arrived within {secs:.1f} s")

        def run():
            try:
                src = find_source()
                inner = self._recv_from(t, src, tag, tensors)
                inner.wait()
                outer.set_source(src)
                outer.finish()
            except Exception as e:  # noqa: BLE001
                outer.finish(e)

        th = threading.Thread(target=run, name="harp-anysource", daemon=True)
        state["thread"] = th
        outer.add_waiter(th.join)
        th.start()
        return outer

    # -- coalescing (batch_isend_irecv and _coalescing_manager) ------------------------------------------------
    def _join(self, opname, works, opts, result):
        w = HarpWork(opname, self._desc, result=result, waiters=[lambda: [x.wait() for x in works]])
        if getattr(opts, "asyncOp", True):
            th = threading.Thread(target=w.run_to_completion, daemon=True)
            th.start()
        else:
            w.wait()
        return w

    # -- lifetime ---------------------------------------------------------------------------------------------
    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        for c in self._done.values():
            c.stop()
        for c in (self._up, self._down, self._coll):
            if c is not None:
                c.destroy()
        for b in self._other.values():
            try:
                b.shutdown()
            except Exception:  # noqa: BLE001
                pass

    def abort(self):
        for c in (self._coll, self._up, self._down):
            if c is not None:
                try:
                    c.abort("torch.distributed abort")
                except HarpError:
                    pass
        self.shutdown()

    # -- fault tolerance: dist.shrink_group ------------------------------------------------------
    # torch 2.13's backend-neutral shrink_group(ranks_to_exclude) checks `supports_shrinking`, then calls
    # shrink(sorted excluded ranks, flags, options) on the survivors only and registers the backend it returns
    # in a new group (it destroys this one afterwards). The survivors rendezvous afresh through the same c10d
    # store under a prefix unique to this shrink (every survivor counts its shrinks alike); like the core's
    # Communicator.shrink, the new group makes new connections.
    @property
    def supports_shrinking(self):
        return True

    def shrink(self, ranks_to_exclude, shrink_flags=0, opts=None):
        ex = []
        for r in ranks_to_exclude:
            if not _is_int(r) or not 0 <= r < self._size:
                raise InvalidArgumentError(f"harp shrink on {self._desc}: ranks_to_exclude has {r!r}, not a rank "
                                           f"(allowed: 0 to {self._size - 1})")
            ex.append(int(r))
        ex = sorted(set(ex))
        if self._rank in ex:
            raise InvalidArgumentError(f"harp shrink on {self._desc}: ranks_to_exclude has this rank, {self._rank}: "
                                       "excluded ranks must not call shrink (allowed: the other ranks)")
        if not _is_int(shrink_flags) or shrink_flags not in (0, 1):
            raise InvalidArgumentError(f"harp shrink on {self._desc}: shrink_flags {shrink_flags!r} is not allowed: "
                                       "0 (SHRINK_DEFAULT) or 1 (SHRINK_ABORT)")
        if shrink_flags & 1:  # SHRINK_ABORT: fail the parent's pending operations first
            for c in (self._coll, self._up, self._down):
                if c is not None:
                    c.revoke()
        self._shrinks = getattr(self, "_shrinks", 0) + 1
        keep = [r for r in range(self._size) if r not in ex]
        prefix = f"harp/shrink{self._shrinks}-{'.'.join(map(str, ex))}/"
        t = getattr(opts, "_timeout", None) if opts is not None else None
        timeout = t if t is not None else (None if self._timeout < 0 else datetime.timedelta(seconds=self._timeout))
        return ProcessGroupHarp(dist.PrefixStore(prefix, self._store), keep.index(self._rank), len(keep), timeout,
                                f"{self._name}:shrunk")

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _install_shrink_shim():
    """torch 2.13's shrink_group assumes a C++ c10d Backend: it fetches the group's with _get_backend(device)
    and registers the shrunk one in a fresh ProcessGroup. A Python process group (this one) has no C++ backend,
    so for a ProcessGroupHarp the group itself is the backend, and the ProcessGroupHarp that shrink() returns is
    the new group — as torch's _new_process_group_helper treats Python process groups. Other groups go through
    torch's own code untouched."""
    c10d = dist.distributed_c10d
    validate = getattr(c10d, "_validate_shrink_backend_requirements", None)
    create = getattr(c10d, "_create_shrunk_process_group", None)
    if validate is None or create is None or getattr(validate, "_harp", False):
        return

    def _validate(group_info):
        pg = group_info["process_group"]
        return pg if isinstance(pg, ProcessGroupHarp) else validate(group_info)

    def _create(new_backend, remaining_ranks, metadata, is_default_group):
        if not isinstance(new_backend, ProcessGroupHarp):
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        desc = "default:shrunken" if is_default_group else f"{metadata['original_group_name']}:shrunk"
        new_backend._set_group_desc(desc)
        return new_backend

    _validate._harp = True
    c10d._validate_shrink_backend_requirements = _validate
    c10d._create_shrunk_process_group = _create


_install_shrink_shim()

_tls = threading.local()


class _AsyncOpts:
    asyncOp = True


_ASYNC = _AsyncOpts()


def _async_like(opts, cls):
    o = cls()
    o.asyncOp = True
    o.timeout = opts.timeout
    return o
