"""Integer arguments of every public entry point, swept beyond every C type.

Each integer argument of harp (Communicator, Work, init), harp.nccl (its functions and
NcclCommunicator) and the torch backend (ProcessGroupHarp's methods, where torch passes the
integer through) is called with values around the int32, uint32, int64 and uint64 boundaries
(+-1), huge and negative ones, and random integers (hypothesis). Every value outside what the
argument allows must raise harp.InvalidArgumentError (for harp.nccl: NcclInvalidArgument, which is
one) whose text names the argument, the value and what is allowed -- never OverflowError,
TypeError, KeyError, or a value silently wrapped into another (ctypes' c_int(2**32 + 7) is 7).

The entry points are found by introspection (each module's __all__, each public class's own
methods and their signatures): test_every_entry_point_is_listed fails when an entry point, or an
integer-looking parameter of one, is missing from TABLE, so a new one cannot be left out silently.

Ranks: two communicators of two ranks each (harp over loopback sockets, harp.nccl through
ncclCommInitAll, the torch group over a HashStore), as threads of this process: every refused
value is refused locally before any traffic, so rank 1 only has to exist.
"""
from __future__ import annotations

import datetime
import inspect
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harp
from harp import _harp, nccl

INF = float("inf")
B = (2**31, 2**32, 2**63, 2**64)
BOUNDARIES = sorted({s * b + d for b in B for s in (1, -1) for d in (-1, 0, 1)}
                    | {-2, -1, 0, 1, 2, 3, 10**30, -10**30, 2**200, -2**200})


@dataclass
class Spec:
    """One integer argument: the values it allows ([lo, hi]; others must be refused), the word
    its errors use for it, and call(env, v) making the call with v there and valid arguments
    elsewhere. domain: the values that can reach this code at all (torch's int64 option fields)."""
    lo: float
    hi: float
    call: Callable
    word: str
    domain: tuple = (-INF, INF)
    named: bool = True   # False: the library's text names the argument, not the value


# -- the objects called --------------------------------------------------------------------------------

def _pair(make):
    """make(rank) for ranks 0 and 1 in two threads (creation is collective)."""
    out, errs = [None, None], []

    def run(r):
        try:
            out[r] = make(r)
        except BaseException as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    if errs:
        raise errs[0]
    return out


class Env:
    def __init__(self):
        uid = harp.get_unique_id("127.0.0.1:0")
        self.comms = _pair(lambda r: harp.Communicator(r, 2, uid, timeout=30))
        self.c = self.comms[0]
        works = _pair(lambda r: self.comms[r].allreduce(np.ones(4, np.float32), async_op=True))
        for w in works:
            w.wait()
        self.work = works[0]
        cws = _pair(lambda r: self.comms[r].allreduce_coalesced([np.ones(4, np.float32)], async_op=True))
        for w in cws:
            w.wait()
        self.cwork = cws[0]
        self.nc = nccl.NcclCommunicator.initAll(2)
        self.n = self.nc[0]
        self.pg = None

    def torch_pg(self):
        if self.pg is None:
            import torch.distributed as dist
            from harp.torch._pg import ProcessGroupHarp
            store = dist.HashStore()
            self.pgs = _pair(lambda r: ProcessGroupHarp(store, r, 2, datetime.timedelta(seconds=30)))
            self.pg = self.pgs[0]
        return self.pg

    def close(self):
        _pair(lambda r: self.comms[r].destroy())
        for c in self.nc:
            c.destroy()
        if self.pg is not None:
            _pair(lambda r: self.pgs[r].shutdown())


_ENV = None


@pytest.fixture(scope="module")
def env():
    global _ENV
    _ENV = Env()
    yield _ENV
    _ENV.close()
    _ENV = None


def x4():
    return np.ones(4, np.float32)


def _store():
    class S(_harp.Store):
        def set(self, k, v):
            raise AssertionError("a refused argument reached the store")
        get = add = set
    return S()


def _tensor():
    import torch
    return torch.ones(4)


def _opts(cls, **kw):
    from torch._C import _distributed_c10d as c10d
    o = getattr(c10d, cls)()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


I32, U32, I64, U64 = (-2**31, 2**31 - 1), (0, 2**32 - 1), (-2**63, 2**63 - 1), (0, 2**64 - 1)
F = nccl.NCCL_FLOAT32


def _timeout_specs(fn):
    """timeout= of a harp call: a number of seconds > 0 (None: the communicator's)."""
    return {"timeout": Spec(1, INF, fn, "timeout")}


def _fresh(fn):
    """fn(a fresh unique id), the id's store stopped afterwards (refused calls never use it)."""
    uid = harp.get_unique_id("127.0.0.1:0")
    try:
        return fn(uid)
    finally:
        uid.release()


def _init(v):
    return _fresh(lambda uid: harp.init(timeout=v, env={"HARP_RANK": "0", "HARP_WORLD_SIZE": "1",
                                                        "HARP_UNIQUE_ID": uid.hex()}))


# entry point -> {argument: Spec}; {} for an entry point without integer arguments.
TABLE = {
    # harp -----------------------------------------------------------------------------------------
    "harp.get_unique_id": {}, "harp.launch_env": {}, "harp.transports": {},
    "harp.init": _timeout_specs(lambda e, v: _init(v)),
    "harp.Communicator.__init__": {
        "rank": Spec(0, 0, lambda e, v: _fresh(lambda u: harp.Communicator(v, 1, u)), "rank"),
        "size": Spec(1, 2**31 - 1, lambda e, v: _fresh(lambda u: harp.Communicator(0, v, u)), "size"),
        "timeout": Spec(1, INF, lambda e, v: _fresh(lambda u: harp.Communicator(0, 1, u, timeout=v)), "timeout"),
        "unique_id": Spec(1, 0, lambda e, v: harp.Communicator(0, 1, v), "unique_id", named=False)},
    "harp.Communicator.from_store": {
        "rank": Spec(*I32, lambda e, v: harp.Communicator.from_store(_store(), v, 1), "rank"),
        "size": Spec(*I32, lambda e, v: harp.Communicator.from_store(_store(), 0, v), "size"),
        "timeout": Spec(1, INF, lambda e, v: harp.Communicator.from_store(_store(), 0, 1, timeout=v), "timeout")},
    "harp.Communicator.transport": {"peer": Spec(0, 1, lambda e, v: e.c.transport(v), "peer")},
    "harp.Communicator.algorithm": {"count": Spec(*U64, lambda e, v: e.c.algorithm("allreduce", v), "count")},
    "harp.Communicator.allreduce": {
        "op": Spec(0, 7, lambda e, v: e.c.allreduce(x4(), op=v, timeout=1), "op"),
        **_timeout_specs(lambda e, v: e.c.allreduce(x4(), timeout=v))},
    "harp.Communicator.broadcast": {
        "root": Spec(0, 1, lambda e, v: e.c.broadcast(x4(), root=v), "root"),
        **_timeout_specs(lambda e, v: e.c.broadcast(x4(), timeout=v))},
    "harp.Communicator.reduce": {
        "root": Spec(0, 1, lambda e, v: e.c.reduce(x4(), root=v), "root"),
        "op": Spec(0, 7, lambda e, v: e.c.reduce(x4(), op=v, root=0, timeout=1), "op"),
        **_timeout_specs(lambda e, v: e.c.reduce(x4(), timeout=v))},
    "harp.Communicator.allgather": _timeout_specs(lambda e, v: e.c.allgather(x4(), timeout=v)),
    "harp.Communicator.reduce_scatter": {
        "op": Spec(0, 7, lambda e, v: e.c.reduce_scatter(x4(), op=v, timeout=1), "op"),
        **_timeout_specs(lambda e, v: e.c.reduce_scatter(x4(), timeout=v))},
    "harp.Communicator.alltoall": _timeout_specs(lambda e, v: e.c.alltoall(x4(), timeout=v)),
    "harp.Communicator.alltoallv": {
        "sendcounts": Spec(0, 4, lambda e, v: e.c.alltoallv(x4(), [v, 0], x4(), [2, 2]), "sendcounts[0]"),
        "recvcounts": Spec(0, 4, lambda e, v: e.c.alltoallv(x4(), [2, 2], x4(), [0, v]), "recvcounts[1]"),
        "sdispls": Spec(0, 4, lambda e, v: e.c.alltoallv(x4(), [2, 2], x4(), [2, 2], [v, 2]), "sdispls[0]"),
        "rdispls": Spec(0, 4, lambda e, v: e.c.alltoallv(x4(), [2, 2], x4(), [2, 2], None, [0, v]), "rdispls[1]"),
        **_timeout_specs(lambda e, v: e.c.alltoallv(x4(), [2, 2], x4(), [2, 2], timeout=v))},
    "harp.Communicator.gather": {
        "root": Spec(0, 1, lambda e, v: e.c.gather(x4(), root=v), "root"),
        **_timeout_specs(lambda e, v: e.c.gather(x4(), timeout=v))},
    "harp.Communicator.scatter": {
        "root": Spec(0, 1, lambda e, v: e.c.scatter(x4(), x4(), root=v), "root"),
        **_timeout_specs(lambda e, v: e.c.scatter(np.ones(8, np.float32), x4(), timeout=v))},
    "harp.Communicator.barrier": _timeout_specs(lambda e, v: e.c.barrier(timeout=v)),
    "harp.Communicator.send": {
        "peer": Spec(1, 1, lambda e, v: e.c.send(x4(), v), "peer"),
        "tag": Spec(*U32, lambda e, v: e.c.send(x4(), 1, v), "tag"),
        **_timeout_specs(lambda e, v: e.c.send(x4(), 1, timeout=v))},
    "harp.Communicator.recv": {
        "peer": Spec(1, 1, lambda e, v: e.c.recv(x4(), v), "peer"),
        "tag": Spec(*U32, lambda e, v: e.c.recv(x4(), 1, v), "tag"),
        **_timeout_specs(lambda e, v: e.c.recv(x4(), 1, timeout=v))},
    "harp.Communicator.split": {
        "color": Spec(*I32, lambda e, v: e.c.split(v), "color"),
        "key": Spec(*I32, lambda e, v: e.c.split(0, v), "key")},
    "harp.Communicator.shrink": {"exclude": Spec(0, 1, lambda e, v: e.c.shrink([v]), "exclude")},
    "harp.Communicator.grow": {"new_size": Spec(3, 2**31 - 1, lambda e, v: e.c.grow(v), "new_size"),
                               "unique_id": Spec(1, 0, lambda e, v: e.c.grow(3, v), "unique_id", named=False)},
    "harp.Communicator.allreduce_coalesced": {
        "op": Spec(0, 7, lambda e, v: e.c.allreduce_coalesced([x4()], op=v), "op"),
        **_timeout_specs(lambda e, v: e.c.allreduce_coalesced([x4()], timeout=v))},
    "harp.Communicator.abort": {}, "harp.Communicator.destroy": {}, "harp.Communicator.close": {},
    "harp.Communicator.payload_mac": {},
    "harp.Communicator.revoke": {}, "harp.Communicator.failed_ranks": {}, "harp.Communicator.agree": {},
    "harp.Work.__init__": {}, "harp.Work.test": {}, "harp.Work.is_completed": {},
    "harp.Work.wait": {"timeout": Spec(0, INF, lambda e, v: e.work.wait(v), "timeout")},
    "harp.coalesce.CoalescedWork.__init__": {}, "harp.coalesce.CoalescedWork.test": {},
    "harp.coalesce.CoalescedWork.is_completed": {},
    "harp.coalesce.CoalescedWork.wait": {"timeout": Spec(0, INF, lambda e, v: e.cwork.wait(v), "timeout")},
    "harp.UniqueId.__init__": {}, "harp.UniqueId.hex": {}, "harp.UniqueId.from_hex": {},
    "harp.UniqueId.release": {},
    # harp.nccl ------------------------------------------------------------------------------------
    "harp.nccl.get_unique_id": {}, "harp.nccl.get_version": {}, "harp.nccl.get_build_version": {},
    "harp.nccl.groupStart": {}, "harp.nccl.groupEnd": {}, "harp.nccl.get_last_error": {},
    "harp.nccl.calls_served": {}, "harp.nccl.library_path": {},
    "harp.nccl.mem_alloc": {"size": Spec(*U64, lambda e, v: nccl.mem_alloc(v), "size")},
    "harp.nccl.mem_free": {"ptr": Spec(*U64, lambda e, v: nccl.mem_free(v), "ptr")},
    "harp.nccl.NcclCommunicator.__init__": {
        "ndev": Spec(1, 2**31 - 1, lambda e, v: nccl.NcclCommunicator(v, nccl.get_unique_id(), 0), "nranks"),
        "rank": Spec(0, 0, lambda e, v: nccl.NcclCommunicator(1, nccl.get_unique_id(), v), "rank"),
        "commId": Spec(-128, 255, lambda e, v: nccl.NcclCommunicator(1, (v,) + (0,) * 127, 0), "commId[0]")},
    "harp.nccl.NcclCommunicator.initAll": {
        "devices": Spec(1, 2**31 - 1, lambda e, v: nccl.NcclCommunicator.initAll(v), "devices")},
    "harp.nccl.NcclCommunicator.split": {
        "color": Spec(*I32, lambda e, v: e.n.split(v, 0), "color"),
        "key": Spec(*I32, lambda e, v: e.n.split(0, v), "key")},
    "harp.nccl.NcclCommunicator.revoke": {"flags": Spec(0, 0, lambda e, v: e.n.revoke(v), "flags")},
    "harp.nccl.NcclCommunicator.shrink": {
        "exclude": Spec(*I32, lambda e, v: e.n.shrink([v]), "exclude[0]"),
        "flags": Spec(*I32, lambda e, v: e.n.shrink([1], v), "flags")},
    "harp.nccl.NcclCommunicator.grow": {
        "nranks": Spec(*I32, lambda e, v: e.n.grow(v), "nranks"),
        "commId": Spec(-128, 255, lambda e, v: e.n.grow(3, (v,) + (0,) * 127), "commId[0]")},
    "harp.nccl.NcclCommunicator.join": {
        "nranks": Spec(*I32, lambda e, v: nccl.NcclCommunicator.join(v, nccl.get_unique_id(), 2), "nranks"),
        "rank": Spec(*I32, lambda e, v: nccl.NcclCommunicator.join(3, nccl.get_unique_id(), v), "rank"),
        "commId": Spec(-128, 255, lambda e, v: nccl.NcclCommunicator.join(3, (v,) + (0,) * 127, 2), "commId[0]")},
    "harp.nccl.NcclCommunicator.allReduce": {
        "sendbuf": Spec(*U64, lambda e, v: e.n.allReduce(v, x4(), 4, F, 0), "sendbuf"),
        "recvbuf": Spec(*U64, lambda e, v: e.n.allReduce(x4(), v, 4, F, 0), "recvbuf"),
        "count": Spec(*U64, lambda e, v: e.n.allReduce(x4(), x4(), v, F, 0), "count"),
        "datatype": Spec(0, 9, lambda e, v: e.n.allReduce(x4(), x4(), 0, v, 0), "datatype"),
        "op": Spec(0, 4, lambda e, v: e.n.allReduce(x4(), x4(), 0, F, v), "op"),
        "stream": Spec(*U64, lambda e, v: e.n.allReduce(x4(), x4(), 4, F, 0, v), "stream")},
    "harp.nccl.NcclCommunicator.reduce": {
        "sendbuf": Spec(*U64, lambda e, v: e.n.reduce(v, x4(), 4, F, 0, 0), "sendbuf"),
        "recvbuf": Spec(*U64, lambda e, v: e.n.reduce(x4(), v, 4, F, 0, 0), "recvbuf"),
        "count": Spec(*U64, lambda e, v: e.n.reduce(x4(), x4(), v, F, 0, 0), "count"),
        "datatype": Spec(0, 9, lambda e, v: e.n.reduce(x4(), x4(), 0, v, 0, 0), "datatype"),
        "op": Spec(0, 4, lambda e, v: e.n.reduce(x4(), x4(), 0, F, v, 0), "op"),
        "root": Spec(0, 1, lambda e, v: e.n.reduce(x4(), x4(), 0, F, 0, v), "root"),
        "stream": Spec(*U64, lambda e, v: e.n.reduce(x4(), x4(), 4, F, 0, 0, v), "stream")},
    "harp.nccl.NcclCommunicator.broadcast": {
        "sendbuff": Spec(*U64, lambda e, v: e.n.broadcast(v, x4(), 4, F, 0), "sendbuff"),
        "recvbuff": Spec(*U64, lambda e, v: e.n.broadcast(x4(), v, 4, F, 0), "recvbuff"),
        "count": Spec(*U64, lambda e, v: e.n.broadcast(x4(), x4(), v, F, 0), "count"),
        "datatype": Spec(0, 9, lambda e, v: e.n.broadcast(x4(), x4(), 0, v, 0), "datatype"),
        "root": Spec(0, 1, lambda e, v: e.n.broadcast(x4(), x4(), 0, F, v), "root"),
        "stream": Spec(*U64, lambda e, v: e.n.broadcast(x4(), x4(), 4, F, 0, v), "stream")},
    "harp.nccl.NcclCommunicator.bcast": {
        "buff": Spec(*U64, lambda e, v: e.n.bcast(v, 4, F, 0), "buff"),
        "count": Spec(*U64, lambda e, v: e.n.bcast(x4(), v, F, 0), "count"),
        "datatype": Spec(0, 9, lambda e, v: e.n.bcast(x4(), 0, v, 0), "datatype"),
        "root": Spec(0, 1, lambda e, v: e.n.bcast(x4(), 0, F, v), "root"),
        "stream": Spec(*U64, lambda e, v: e.n.bcast(x4(), 4, F, 0, v), "stream")},
    "harp.nccl.NcclCommunicator.reduceScatter": {
        "sendbuf": Spec(*U64, lambda e, v: e.n.reduceScatter(v, x4(), 2, F, 0), "sendbuf"),
        "recvbuf": Spec(*U64, lambda e, v: e.n.reduceScatter(x4(), v, 2, F, 0), "recvbuf"),
        "recvcount": Spec(*U64, lambda e, v: e.n.reduceScatter(x4(), x4(), v, F, 0), "recvcount"),
        "datatype": Spec(0, 9, lambda e, v: e.n.reduceScatter(x4(), x4(), 0, v, 0), "datatype"),
        "op": Spec(0, 4, lambda e, v: e.n.reduceScatter(x4(), x4(), 0, F, v), "op"),
        "stream": Spec(*U64, lambda e, v: e.n.reduceScatter(x4(), x4(), 2, F, 0, v), "stream")},
    "harp.nccl.NcclCommunicator.allGather": {
        "sendbuf": Spec(*U64, lambda e, v: e.n.allGather(v, x4(), 2, F), "sendbuf"),
        "recvbuf": Spec(*U64, lambda e, v: e.n.allGather(x4(), v, 2, F), "recvbuf"),
        "count": Spec(*U64, lambda e, v: e.n.allGather(x4(), x4(), v, F), "count"),
        "datatype": Spec(0, 9, lambda e, v: e.n.allGather(x4(), x4(), 0, v), "datatype"),
        "stream": Spec(*U64, lambda e, v: e.n.allGather(x4(), x4(), 2, F, v), "stream")},
    "harp.nccl.NcclCommunicator.send": {
        "sendbuf": Spec(*U64, lambda e, v: e.n.send(v, 4, F, 1), "sendbuf"),
        "count": Spec(*U64, lambda e, v: e.n.send(x4(), v, F, 1), "count"),
        "datatype": Spec(0, 9, lambda e, v: e.n.send(x4(), 0, v, 1), "datatype"),
        "peer": Spec(0, 1, lambda e, v: e.n.send(x4(), 0, F, v), "peer"),
        "stream": Spec(*U64, lambda e, v: e.n.send(x4(), 4, F, 1, v), "stream")},
    "harp.nccl.NcclCommunicator.recv": {
        "recvbuf": Spec(*U64, lambda e, v: e.n.recv(v, 4, F, 1), "recvbuf"),
        "count": Spec(*U64, lambda e, v: e.n.recv(x4(), v, F, 1), "count"),
        "datatype": Spec(0, 9, lambda e, v: e.n.recv(x4(), 0, v, 1), "datatype"),
        "peer": Spec(0, 1, lambda e, v: e.n.recv(x4(), 0, F, v), "peer"),
        "stream": Spec(*U64, lambda e, v: e.n.recv(x4(), 4, F, 1, v), "stream")},
    "harp.nccl.NcclCommunicator.create_premul_sum": {
        "scalar": Spec(*U64, lambda e, v: e.n.create_premul_sum(v, F), "scalar"),
        "datatype": Spec(0, 9, lambda e, v: e.n.create_premul_sum(x4(), v), "datatype"),
        "residence": Spec(0, 1, lambda e, v: e.n.create_premul_sum(x4(), F, v), "residence")},
    "harp.nccl.NcclCommunicator.destroy_op": {"op": Spec(1, 0, lambda e, v: e.n.destroy_op(v), "op")},
    "harp.nccl.NcclCommunicator.register": {
        "buf": Spec(*U64, lambda e, v: e.n.register(v, 16), "buf"),
        "nbytes": Spec(*U64, lambda e, v: e.n.register(x4(), v), "nbytes")},
    "harp.nccl.NcclCommunicator.deregister": {"handle": Spec(*U64, lambda e, v: e.n.deregister(v), "handle")},
    **{f"harp.nccl.NcclCommunicator.{m}": {} for m in (
        "destroy", "abort", "finalize", "get_unique_id", "device_id", "rank_id", "size", "check_async_error",
        "get_async_error")},
    # torch backend: the integers torch hands over as they came (rootRank in int64 option fields) ---
    "ProcessGroupHarp.broadcast": {"opts.rootRank": Spec(0, 1, lambda e, v: e.torch_pg().broadcast(
        [_tensor()], _opts("BroadcastOptions", rootRank=v)), "root", domain=I64)},
    "ProcessGroupHarp.reduce": {"opts.rootRank": Spec(0, 1, lambda e, v: e.torch_pg().reduce(
        [_tensor()], _opts("ReduceOptions", rootRank=v)), "root", domain=I64)},
    "ProcessGroupHarp.gather": {"opts.rootRank": Spec(0, 1, lambda e, v: e.torch_pg().gather(
        [[_tensor(), _tensor()]], [_tensor()], _opts("GatherOptions", rootRank=v)), "root", domain=I64)},
    "ProcessGroupHarp.scatter": {"opts.rootRank": Spec(0, 1, lambda e, v: e.torch_pg().scatter(
        [_tensor()], [[_tensor(), _tensor()]], _opts("ScatterOptions", rootRank=v)), "root", domain=I64)},
    "ProcessGroupHarp.send": {
        "dst": Spec(1, 1, lambda e, v: e.torch_pg().send([_tensor()], v, 0), "dst"),
        "tag": Spec(*U32, lambda e, v: e.torch_pg().send([_tensor()], 1, v), "tag")},
    "ProcessGroupHarp.recv": {
        "src": Spec(1, 1, lambda e, v: e.torch_pg().recv([_tensor()], v, 0), "src"),
        "tag": Spec(*U32, lambda e, v: e.torch_pg().recv([_tensor()], 1, v), "tag")},
    "ProcessGroupHarp.recv_anysource": {
        "tag": Spec(*U32, lambda e, v: e.torch_pg().recv_anysource([_tensor()], v), "tag")},
    "ProcessGroupHarp.all_to_all_single": {
        "input_split_sizes": Spec(4, 4, lambda e, v: e.torch_pg().all_to_all_single(
            _tensor(), _tensor(), [2, 2], [v, 0]), "split sizes"),
        "output_split_sizes": Spec(4, 4, lambda e, v: e.torch_pg().all_to_all_single(
            _tensor(), _tensor(), [0, v], [2, 2]), "split sizes")},
    "ProcessGroupHarp.shrink": {
        "ranks_to_exclude": Spec(1, 1, lambda e, v: e.torch_pg().shrink([v]), "ranks_to_exclude"),
        "shrink_flags": Spec(0, 1, lambda e, v: e.torch_pg().shrink([1], v), "shrink_flags")},
    "ProcessGroupHarp.monitored_barrier": {},  # timeout: a timedelta (torch's rule: see test_torch)
}
# ProcessGroupHarp methods whose only integers are tensors' and torch's own option fields (timeout,
# asyncOp: timedeltas and bools), or that take none.
for _m in ("__init__", "getBackendName", "setGroupName", "setGroupDesc", "allreduce", "allreduce_coalesced",
           "allgather", "all_gather_single", "all_gather_single_coalesced", "allgather_coalesced",
           "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced", "alltoall", "barrier",
           "shutdown", "abort", "size", "rank"):
    TABLE[f"ProcessGroupHarp.{_m}"] = {}
# Aliases torch looks up by its other names are the same functions.
ALIASES = {"ProcessGroupHarp._allgather_base": "all_gather_single", "ProcessGroupHarp.alltoall_base":
           "all_to_all_single", "ProcessGroupHarp.allgather_into_tensor_coalesced": "all_gather_single_coalesced",
           "ProcessGroupHarp._reduce_scatter_base": "reduce_scatter_single",
           "ProcessGroupHarp.reduce_scatter_tensor_coalesced": "reduce_scatter_single_coalesced"}

# Parameter names that carry integers somewhere in the API: each such parameter of an entry point
# must be in its TABLE row (or be declared there as not an integer, by NOT_INT).
INT_NAMES = {"unique_id", "rank", "size", "root", "peer", "tag", "count", "recvcount", "color", "key", "dst", "src",
             "new_size", "nranks", "ndev", "datatype", "op", "flags", "nbytes", "ptr", "handle", "stream",
             "residence", "devices", "exclude", "ranks_to_exclude", "shrink_flags", "timeout", "sendcounts",
             "recvcounts", "sdispls", "rdispls", "output_split_sizes", "input_split_sizes", "sendbuf", "recvbuf",
             "sendbuff", "recvbuff", "buff", "buf", "scalar", "commId"}
# (entry, parameter) that look like integers by name but are not: a string residual key; buffers
# that must be arrays (harp.Communicator's) rather than addresses; a torch timedelta.
NOT_INT = {("harp.Communicator.allreduce", "key"), ("ProcessGroupHarp.monitored_barrier", "timeout"),
           ("ProcessGroupHarp.__init__", "rank"), ("ProcessGroupHarp.__init__", "size"),
           ("ProcessGroupHarp.__init__", "timeout")}
NOT_INT |= {(f"harp.Communicator.{m}", p) for m in ("broadcast", "send", "recv") for p in ("buf",)}
NOT_INT |= {(f"harp.Communicator.{m}", p) for m in ("allreduce", "reduce", "allgather", "reduce_scatter", "alltoall",
                                                     "alltoallv", "gather", "scatter") for p in ("sendbuf", "recvbuf")}


def entry_points():
    """{name: function} of every public entry point, found by introspection."""
    from harp.torch._pg import ProcessGroupHarp
    out = {}

    def methods(prefix, cls):
        for name, f in vars(cls).items():
            if name.startswith("_") and name != "__init__":
                continue
            f = f.__func__ if isinstance(f, (staticmethod, classmethod)) else f
            if inspect.isfunction(f):
                out[f"{prefix}.{name}"] = f

    for modname, mod in (("harp", harp), ("harp.nccl", nccl)):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj):
                out[f"{modname}.{name}"] = obj
            elif inspect.isclass(obj) and not issubclass(obj, BaseException) and obj.__module__.startswith("harp") \
                    and not issubclass(obj, int):  # DataType/ReduceOp: enums, not entry points
                methods(f"{modname}.{name}", obj)
    from harp.coalesce import CoalescedWork  # what allreduce_coalesced(async_op=True) returns
    methods("harp.coalesce.CoalescedWork", CoalescedWork)
    methods("ProcessGroupHarp", ProcessGroupHarp)
    for alias in ALIASES:
        out.pop(alias, None)
    return out


def test_every_entry_point_is_listed():
    found = entry_points()
    assert len(found) > 80, sorted(found)
    missing = sorted(set(found) - set(TABLE))
    stale = sorted(set(TABLE) - set(found))
    assert not missing, f"entry points without a TABLE row (list their integer arguments): {missing}"
    assert not stale, f"TABLE rows for entry points that no longer exist: {stale}"
    unlisted = []
    for name, f in found.items():
        params = inspect.signature(f).parameters
        for p, prm in params.items():
            intlike = p in INT_NAMES or (isinstance(prm.default, int) and not isinstance(prm.default, bool)) or \
                "int" in str(prm.annotation)
            if intlike and p not in TABLE[name] and (name, p) not in NOT_INT and p != "self":
                unlisted.append(f"{name}({p})")
        for p in TABLE[name]:
            assert p.split(".")[0] in params, f"{name}: TABLE names {p}, which it does not take"
    assert not unlisted, f"integer-looking parameters missing from TABLE: {unlisted}"


CASES = [(name, arg) for name, row in TABLE.items() for arg in row]


def _check_refused(env, name, arg, spec, v):
    try:
        spec.call(env, v)
    except harp.InvalidArgumentError as e:
        msg = str(e)
        assert spec.word.lower() in msg.lower(), f"{name}({arg}={v}): the error does not name {spec.word!r}: {msg}"
        if spec.named:
            assert str(v) in msg, f"{name}({arg}={v}): the error does not name the value: {msg}"
        return msg
    except Exception as e:  # noqa: BLE001 - any other class is the defect
        pytest.fail(f"{name}({arg}={v}) raised {type(e).__name__}, not a HARP error: {e}")
    pytest.fail(f"{name}({arg}={v}): accepted a value outside [{spec.lo}, {spec.hi}]")


def _outside(spec, v):
    return not spec.lo <= v <= spec.hi and spec.domain[0] <= v <= spec.domain[1]


@pytest.mark.parametrize("name,arg", CASES, ids=[f"{n}({a})" for n, a in CASES])
def test_integers_beyond_every_c_type_are_refused_by_name(env, name, arg):
    if name.startswith("ProcessGroupHarp"):
        pytest.importorskip("torch")
    spec = TABLE[name][arg]
    for v in BOUNDARIES:
        if _outside(spec, v):
            _check_refused(env, name, arg, spec, v)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(v=st.integers(min_value=-2**70, max_value=2**70) | st.integers())
    def random(v):
        if _outside(spec, v):
            _check_refused(env, name, arg, spec, v)
    random()


def test_error_says_what_is_allowed(env):
    """The texts name the allowed values, not only the refused one."""
    msg = _check_refused(env, "harp.Communicator.broadcast", "root", TABLE["harp.Communicator.broadcast"]["root"],
                         2**63)
    assert msg == "broadcast: root 9223372036854775808 is out of range [0, 1]", msg
    msg = _check_refused(env, "harp.Communicator.algorithm", "count", TABLE["harp.Communicator.algorithm"]["count"],
                         -1)
    assert "[0, 18446744073709551615]" in msg, msg
    with pytest.raises(harp.InvalidArgumentError, match=r"collective 'nonexistent' is not a collective \(known: "
                                                         r"allreduce, broadcast"):
        env.c.algorithm("nonexistent", 4)
    with pytest.raises(nccl.NcclInvalidArgument, match=r"allReduce: datatype 4294967303 is out of range "
                                                        r"\[-2147483648, 2147483647\] \(int\)"):
        env.n.allReduce(x4(), x4(), 4, 2**32 + 7, 0)  # was read as datatype 7, float32


def test_extremes_inside_the_range_are_accepted(env):
    """The largest values an argument allows work (they are not refused as 'too large')."""
    assert env.c.algorithm("allreduce", 2**64 - 1)
    res = _pair(lambda r: env.comms[r].allreduce(np.full(4, r + 1.0, np.float32), timeout=2**1100))  # > a double
    assert all((x == 3).all() for x in res)
    got = np.zeros(4, np.float32)
    _pair(lambda r: env.comms[0].send(np.arange(4, dtype=np.float32), 1, 2**32 - 1) if r == 0
          else env.comms[1].recv(got, 0, 2**32 - 1))
    assert (got == np.arange(4)).all()
    subs = _pair(lambda r: env.comms[r].split(2**31 - 1, -2**31 + r))
    assert [s.rank for s in subs] == [0, 1]
    _pair(lambda r: subs[r].destroy())
    assert env.work.wait(2**1100) is not None and env.work.wait(0) is not None
