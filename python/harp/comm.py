"""harp.Communicator — the Python face of a HARP communicator.

Every rank creates one with the same unique id (or through ``harp.init()``,
which reads the launcher's environment) and then calls the same collectives in
the same order. Buffers are numpy arrays or anything with the buffer protocol
or DLPack (CPU). Collectives with an output take ``recvbuf``; when it is None
the operation is in place where that makes sense (allreduce, broadcast,
reduce at the root) or a new array is returned (allgather, gather, ...).

``async_op=True`` returns a :class:`Work`; its ``wait()`` returns the output.
Collectives complete in issue order. The GIL is released while HARP works.
Lifetime: the communicator owns an async call's buffers until the call has
completed, whether or not the Work is kept (dropping the handle of
``allreduce(tmp, async_op=True)`` cannot free ``tmp`` under the collective);
finished calls' buffers are let go on a later call, or when the communicator
object is collected (which first waits for its pending calls).
Blocking allreduce/broadcast on plain C-contiguous numpy arrays are checked
and started in C (``_harp.run_arrays``, about 1 us per call); every other
call takes the general path below, which also words the errors.

Arguments: ``dtype=`` reads a buffer as that datatype, and the element count
is then the buffer's bytes / itemsize (a remainder is refused), so no call
reads or writes past a buffer. ``op`` is a name ('sum', 'max', ...), a
:class:`ReduceOp` or its integer code; ``root``, ``peer``, ``tag`` (0 to
2**32-1) and alltoallv counts are integers (numpy integers too). bool and
float are refused (``op=True`` is not prod, ``root=True`` is not rank 1):
:class:`InvalidArgumentError` naming the argument. Every integer argument is checked against
what it allows (and the C type behind it: rank, size, color and key are C ints, counts size_t)
before anything runs, so a value such as ``root=2**63`` is an InvalidArgumentError naming the
argument, the value and the allowed range, never an OverflowError or a wrapped value.

Timeouts (HARP's rule; the torch backend follows torch's, see harp/torch/_pg.py): a
communicator's or a call's ``timeout`` is None (HARP_TIMEOUT, or the communicator's) or a
number of seconds > 0; 0 and negatives are refused, not read as "unset"; inf, or a number too
large for a double, means no limit. ``Work.wait(timeout)`` takes seconds >= 0, where 0 only
checks; None waits until done (the collective's own timeout bounds that).

Threading: a Communicator may be shared between threads, but all ranks must
issue collectives in the same order, so order your threads' calls yourself.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Optional, Sequence

import numpy as np

from . import _harp
from ._buffers import address, as_array, out_buffer
from ._harp import run_arrays as _run_arrays
from ._types import MAX_TAG, Coll, DataType, ReduceOp, buffer_elems, check_int, parse_dtype, parse_op, typed_count
from ._work import CallLayer, Work, _float, _seconds, wait_seconds  # noqa: F401  (harp.comm.Work and the rules stay importable here)
from .errors import InvalidArgumentError

_ALLREDUCE = int(Coll.allreduce)


# C int (the core's rank, size, color and key), size_t (counts).
INT32 = (-2**31, 2**31 - 1)
SIZE_T = (0, 2**64 - 1)


def _coll_name(collective) -> Coll:
    """A collective by name ('allreduce', ...) or Coll, else InvalidArgumentError listing the names."""
    if isinstance(collective, Coll):
        return collective
    if isinstance(collective, str) and collective in Coll.__members__:
        return Coll[collective]
    raise InvalidArgumentError(f"collective {collective!r} is not a collective (known: {', '.join(Coll.__members__)})")


_claimed: set = set()  # (unique id, rank) pairs this process has joined


def _claim(uid: bytes, rank):
    """One unique id, one communicator: refuse a second join of the same (id, rank) in this process
    at once (the store refuses it across processes, bootstrap/rendezvous.h)."""
    key = (bytes(uid), int(rank) if isinstance(rank, int) else rank)
    if key in _claimed:
        raise InvalidArgumentError(
            f"this process already joined a communicator as rank {rank} with this unique id: a unique id serves "
            "one communicator; create a new one (harp.get_unique_id()) for each communicator, and call harp.init() "
            "once per process")
    _claimed.add(key)


def _comm_args(what, rank, size, timeout, transport):
    """rank and size as C ints, the timeout in seconds (-1: HARP_TIMEOUT). Whether rank < size is the
    core's to say (it reports a bad rank or size to every rank through the store)."""
    if transport is not None and not isinstance(transport, str):
        raise InvalidArgumentError(f"{what}: transport must be a name such as 'tcp' or None, got "
                                   f"{type(transport).__name__} {transport!r}")
    return (check_int(rank, f"{what}: rank", *INT32), check_int(size, f"{what}: size", *INT32),
            _seconds(timeout, f"{what}: timeout"))


def _uid_bytes(unique_id, what: str) -> bytes:
    """The bytes of a UniqueId (or bytes-like). An int is refused: bytes(5) would be 5 zero bytes."""
    if isinstance(unique_id, UniqueId):
        return unique_id.bytes
    if isinstance(unique_id, (bytes, bytearray, memoryview)):
        return bytes(unique_id)
    raise InvalidArgumentError(f"{what} must be a harp.UniqueId (harp.get_unique_id()) or its 128 bytes, got "
                               f"{type(unique_id).__name__}")


class Communicator:
    def __init__(self, rank: int, size: int, unique_id: bytes | None = None, *, timeout: float | None = None,
                 transport: str | None = None, _impl=None):
        if _impl is not None:
            self._c = _impl
            return
        if unique_id is None:
            raise InvalidArgumentError("Communicator needs a unique_id (harp.get_unique_id()) or use harp.init()")
        rank, size, t = _comm_args("Communicator", rank, size, timeout, transport)
        uid = _uid_bytes(unique_id, "Communicator: unique_id")
        _claim(uid, rank)
        self._c = _harp.Comm(uid, rank, size, t, transport or "")

    @classmethod
    def from_store(cls, store, rank: int, size: int, *, prefix: str = "harp/", timeout: float | None = None,
                   transport: str | None = None) -> "Communicator":
        """Rendezvous through a key-value store (an object with set/get/add, e.g. an adapter
        over torch.distributed.Store)."""
        rank, size, t = _comm_args("Communicator.from_store", rank, size, timeout, transport)
        impl = _harp.Comm.from_store(store, prefix, rank, size, t, transport or "")
        return cls(rank, size, _impl=impl)

    # -- properties -------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def timeout(self) -> float:
        return self._c.timeout

    def transport(self, peer: int) -> str:
        """Name of the transport carrying traffic to `peer` ("self" for this rank)."""
        return self._c.transport_name(check_int(peer, "transport: peer", 0, self.size - 1))

    def payload_mac(self, label: str, data: bytes) -> bytes:
        """HMAC-SHA256 (32 bytes) of `data` under a key derived from this communicator's token (never
        sent) and `label`, bound to this communicator: seal bytes that ranks exchange as data and must
        trust before parsing (harp.horovod's broadcast_object and allgather_object, which unpickle).
        As secret as the token: see SECURITY.md for init_process_group("harp")."""
        if not isinstance(label, str):
            raise InvalidArgumentError(f"payload_mac: label must be a str, got {type(label).__name__}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"payload_mac: data must be bytes-like, got {type(data).__name__}")
        return self._c.payload_mac(label, bytes(data))

    def algorithm(self, collective: str, count: int, dtype="float32") -> str:
        """The algorithm the tuning table (and HARP_ALGO) picks for this call (count: elements)."""
        coll = _coll_name(collective)
        count = check_int(count, "algorithm: count", *SIZE_T)
        return self._c.choose_algorithm(int(coll), count, int(parse_dtype(dtype)))

    @property
    def broken(self) -> bool:
        return self._c.broken

    # -- plumbing ---------------------------------------------------------------------
    @property
    def calls(self):
        """This communicator's CallLayer (harp._work): the compiled communicator and the buffers of
        its unfinished async calls, for the fronts built on it (coalesce, compress, the torch
        backend). Not for applications."""
        c = self.__dict__.get("_calls")
        if c is None:
            c = self._calls = CallLayer(self._c)
        return c

    def __del__(self):
        # The core may still be writing into the pending calls' buffers: wait for each (the
        # collective's own timeout bounds this) before the buffers can go.
        c = self.__dict__.get("_calls")
        if c is not None:
            c.wait_all()

    def _run(self, coll, send, recv, count, dt, *, op=ReduceOp.SUM, root=0, peer=-1, tag=0, algo=None,
             timeout=None, async_op=False, result=None, keep=(), v=None):
        # The message names the collective; built only when there is a timeout to check.
        secs = -1.0 if timeout is None else _seconds(timeout, f"{Coll(coll).name}: timeout")
        calls = self.__dict__.get("_calls")
        if calls is not None and calls.pending:
            calls.settle()
        if not async_op and v is None and peer < 0 and timeout is None:
            self._c.run(int(coll), send, recv, int(count), int(dt), int(op), int(root), algo or "")
            return result
        sc, sd, rc, rd = v if v is not None else ([], [], [], [])
        w = self._c.submit(int(coll), send, recv, int(count), int(dt), int(op), int(root), int(peer), int(tag),
                           algo or "", secs, bool(async_op), sc, sd, rc, rd)
        if async_op:
            self.calls.hold(w, keep)
            return Work(w, result, keep)
        return result

    def _fast(self, coll, sendbuf, recvbuf, op, root, dtype, async_op, algo, timeout) -> bool:
        """The common blocking call on plain numpy arrays, checked and run in C++ (about 0.3 us
        instead of 5-10): op and root are checked there too (no bool, no float). False when the
        call needs the general path below (which also words any error)."""
        if dtype is not None or async_op or timeout is not None:
            return False
        return _run_arrays(self._c, coll, sendbuf, recvbuf, op, root, algo)

    def _check_root(self, root, what):
        return check_int(root, f"{what}: root", 0, self.size - 1)

    def _elems(self, coll, count, root=None):
        """(send, receive) elements this rank's buffers hold in a `coll` call of `count`: base/vocab.def's
        byte rule (harp._types.buffer_elems); 0 where this rank has no such buffer."""
        return buffer_elems(coll, count, self.size, root is not None and root == self.rank)

    def _count_of(self, coll, total, what):
        """The count of a `coll` call whose sendbuf has `total` elements (the byte rule: one block per
        rank for reduce_scatter and alltoall); a remainder is refused."""
        blocks = self._elems(coll, 1)[0]
        if total % blocks:
            raise InvalidArgumentError(f"{what}: sendbuf has {total} elements, not a multiple of {self.size} ranks")
        return total // blocks

    @contextlib.contextmanager
    def _root_only(self, coll):
        """Arguments only the root passes: the other ranks are in, or will enter, the
        collective waiting for the root, so refusing them breaks the communicator on every rank at
        once with the reason (they raise PeerError quoting it) instead of leaving them to time out."""
        try:
            yield
        except (InvalidArgumentError, ValueError, TypeError) as e:
            why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            _harp.refuse_rooted(self._c, int(coll), why)
            raise

    # -- collectives -------------------------------------------------------------------
    # dtype= reads a buffer as that datatype: the element count is then the buffer's bytes /
    # itemsize (a remainder is refused), so no call reads or writes past a buffer.
    def allreduce(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, async_op=False, algo=None, timeout=None,
                  compress=None, key=None):
        """Reduce across ranks; every rank gets the result. In place when recvbuf is None.
        compress= ('fp16', 'bf16', 'topk:0.01,ef', 'none'; default HARP_COMPRESS) and key= (top-k
        residual name): wire compression of float32 sum/avg, see harp.compress."""
        if compress is not None or key is not None:
            from . import compress as _compress
            return _compress.allreduce(self, sendbuf, recvbuf, op, compress="" if compress is None else compress,
                                       key=key, dtype=dtype, async_op=async_op, algo=algo, timeout=timeout)
        # _fast() written out: the call is the whole cost of a small allreduce (0.47 -> 0.27 us).
        if dtype is None and timeout is None and not async_op and _run_arrays(self._c, _ALLREDUCE, sendbuf, recvbuf,
                                                                               op, 0, algo):
            return recvbuf if recvbuf is not None else sendbuf
        code = parse_op(op)
        send = as_array(sendbuf, "allreduce: sendbuf", writable=recvbuf is None)
        dt, n = typed_count(send, dtype, "allreduce: sendbuf")
        out = send if recvbuf is None else out_buffer(recvbuf, send, dtype, n, "allreduce")
        result = recvbuf if recvbuf is not None else sendbuf
        return self._run(Coll.allreduce, address(send), address(out), n, dt, op=code, algo=algo,
                         timeout=timeout, async_op=async_op, result=result, keep=(sendbuf, recvbuf, send, out))

    def broadcast(self, buf, root: int = 0, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Copy root's buf to every rank's buf (in place)."""
        if self._fast(Coll.broadcast, buf, None, 0, root, dtype, async_op, algo, timeout):
            return buf
        root = self._check_root(root, "broadcast")
        arr = as_array(buf, "broadcast: buf", writable=True)
        dt, n = typed_count(arr, dtype, "broadcast: buf")
        return self._run(Coll.broadcast, address(arr), address(arr), n, dt, root=root, algo=algo,
                         timeout=timeout, async_op=async_op, result=buf, keep=(buf, arr))

    def reduce(self, sendbuf, recvbuf=None, op="sum", root: int = 0, *, dtype=None, async_op=False, algo=None,
               timeout=None):
        """Reduce to root. recvbuf (root only) defaults to sendbuf (in place at the root)."""
        if self._fast(Coll.reduce, sendbuf, recvbuf, op, root, dtype, async_op, algo, timeout):
            return (recvbuf if recvbuf is not None else sendbuf) if self.rank == root else None
        code = parse_op(op)
        root = self._check_root(root, "reduce")
        is_root = self.rank == root
        send = as_array(sendbuf, "reduce: sendbuf", writable=is_root and recvbuf is None)
        dt, n = typed_count(send, dtype, "reduce: sendbuf")
        out = None
        if is_root:
            with self._root_only(Coll.reduce):
                out = send if recvbuf is None else out_buffer(recvbuf, send, dtype, n, "reduce")
        result = (recvbuf if recvbuf is not None else sendbuf) if is_root else None
        return self._run(Coll.reduce, address(send), address(out) if out is not None else 0, n, dt,
                         op=code, root=root, algo=algo, timeout=timeout, async_op=async_op, result=result,
                         keep=(sendbuf, recvbuf, send, out))

    def allgather(self, sendbuf, recvbuf=None, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Concatenate every rank's sendbuf, in rank order. New array of shape (size, *sendbuf.shape)
        when recvbuf is None (shape (size, n) with dtype=)."""
        out = recvbuf
        if out is None and type(sendbuf) is np.ndarray:
            out = np.empty((self.size,) + sendbuf.shape, sendbuf.dtype)
        if self._fast(Coll.allgather, sendbuf, out, 0, 0, dtype, async_op, algo, timeout):
            return out
        send = as_array(sendbuf, "allgather: sendbuf")
        dt, n = typed_count(send, dtype, "allgather: sendbuf")
        out = out_buffer(recvbuf, send, dtype, self._elems(Coll.allgather, n)[1], "allgather",
                         shape=(self.size,) + send.shape)
        if recvbuf is None and dtype is not None:
            out = out.reshape(self.size, n)
        return self._run(Coll.allgather, address(send), address(out), n, dt, algo=algo, timeout=timeout,
                         async_op=async_op, result=out if recvbuf is None else recvbuf,
                         keep=(sendbuf, recvbuf, send, out))

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, async_op=False, algo=None,
                       timeout=None):
        """Reduce sendbuf (size × n elements) across ranks; rank r gets block r (n elements)."""
        out = recvbuf
        if out is None and type(sendbuf) is np.ndarray and sendbuf.size % self.size == 0:
            out = np.empty(sendbuf.size // self.size, sendbuf.dtype)
        if self._fast(Coll.reduce_scatter, sendbuf, out, op, 0, dtype, async_op, algo, timeout):
            return out
        code = parse_op(op)
        send = as_array(sendbuf, "reduce_scatter: sendbuf")
        dt, total = typed_count(send, dtype, "reduce_scatter: sendbuf")
        n = self._count_of(Coll.reduce_scatter, total, "reduce_scatter")
        out = out_buffer(recvbuf, send, dtype, self._elems(Coll.reduce_scatter, n)[1], "reduce_scatter")
        return self._run(Coll.reduce_scatter, address(send), address(out), n, dt, op=code, algo=algo,
                         timeout=timeout, async_op=async_op, result=out if recvbuf is None else recvbuf,
                         keep=(sendbuf, recvbuf, send, out))

    def alltoall(self, sendbuf, recvbuf=None, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Block q of sendbuf goes to rank q; block q of recvbuf comes from rank q (equal blocks)."""
        out = recvbuf
        if out is None and type(sendbuf) is np.ndarray:
            out = np.empty(sendbuf.shape, sendbuf.dtype)
        if self._fast(Coll.alltoall, sendbuf, out, 0, 0, dtype, async_op, algo, timeout):
            return out
        send = as_array(sendbuf, "alltoall: sendbuf")
        dt, total = typed_count(send, dtype, "alltoall: sendbuf")
        n = self._count_of(Coll.alltoall, total, "alltoall")
        out = out_buffer(recvbuf, send, dtype, self._elems(Coll.alltoall, n)[1], "alltoall", shape=send.shape)
        return self._run(Coll.alltoall, address(send), address(out), n, dt, algo=algo,
                         timeout=timeout, async_op=async_op, result=out if recvbuf is None else recvbuf,
                         keep=(sendbuf, recvbuf, send, out))

    def _counts(self, seq, what: str, limit: int):
        """One non-negative integer per rank (no bool, no float), each <= limit."""
        try:
            vals = list(seq)
        except TypeError:
            raise InvalidArgumentError(f"alltoallv: {what} must be a sequence of {self.size} integers") from None
        if len(vals) != self.size:
            raise InvalidArgumentError(f"alltoallv: {what} has {len(vals)} entries, needs {self.size} (one per rank)")
        return [check_int(x, f"alltoallv: {what}[{i}]", 0, limit) for i, x in enumerate(vals)]

    def alltoallv(self, sendbuf, sendcounts: Sequence[int], recvbuf, recvcounts: Sequence[int],
                  sdispls: Sequence[int] | None = None, rdispls: Sequence[int] | None = None, *, dtype=None,
                  async_op=False, timeout=None):
        """Alltoall with per-rank counts (elements); displacements default to packed."""
        send = as_array(sendbuf, "alltoallv: sendbuf")
        out = as_array(recvbuf, "alltoallv: recvbuf", writable=True)
        if dtype is None and out.dtype != send.dtype:
            raise InvalidArgumentError(f"alltoallv: recvbuf dtype {out.dtype} differs from sendbuf dtype {send.dtype}")
        dt, ns = typed_count(send, dtype, "alltoallv: sendbuf")
        _, nr = typed_count(out, dtype, "alltoallv: recvbuf")
        sc, rc = self._counts(sendcounts, "sendcounts", ns), self._counts(recvcounts, "recvcounts", nr)
        sd = self._counts(sdispls, "sdispls", ns) if sdispls is not None else [sum(sc[:i]) for i in range(self.size)]
        rd = self._counts(rdispls, "rdispls", nr) if rdispls is not None else [sum(rc[:i]) for i in range(self.size)]
        if max((d + c for d, c in zip(sd, sc)), default=0) > ns:
            raise InvalidArgumentError("alltoallv: sendcounts/sdispls reach past the end of sendbuf")
        if max((d + c for d, c in zip(rd, rc)), default=0) > nr:
            raise InvalidArgumentError("alltoallv: recvcounts/rdispls reach past the end of recvbuf")
        return self._run(Coll.alltoallv, address(send), address(out), 0, dt, timeout=timeout, async_op=async_op,
                         result=recvbuf, keep=(sendbuf, recvbuf, send, out), v=(sc, sd, rc, rd))

    def gather(self, sendbuf, recvbuf=None, root: int = 0, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Root receives every rank's sendbuf in rank order; returns it at the root, None elsewhere."""
        root = self._check_root(root, "gather")
        send = as_array(sendbuf, "gather: sendbuf")
        dt, n = typed_count(send, dtype, "gather: sendbuf")
        out = None
        if self.rank == root:
            with self._root_only(Coll.gather):
                out = out_buffer(recvbuf, send, dtype, self._elems(Coll.gather, n, root)[1], "gather",
                                 shape=(self.size,) + send.shape)
            if recvbuf is None and dtype is not None:
                out = out.reshape(self.size, n)
        result = (out if recvbuf is None else recvbuf) if out is not None else None
        return self._run(Coll.gather, address(send), address(out) if out is not None else 0, n, dt,
                         root=root, algo=algo, timeout=timeout, async_op=async_op, result=result,
                         keep=(sendbuf, recvbuf, send, out))

    def scatter(self, sendbuf, recvbuf, root: int = 0, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Block q of root's sendbuf goes to rank q's recvbuf (sendbuf ignored elsewhere)."""
        root = self._check_root(root, "scatter")
        out = as_array(recvbuf, "scatter: recvbuf", writable=True)
        dt, n = typed_count(out, dtype, "scatter: recvbuf")
        send = None
        if self.rank == root:
            with self._root_only(Coll.scatter):
                send = as_array(sendbuf, "scatter: sendbuf")
                if dtype is None and send.dtype != out.dtype:
                    raise InvalidArgumentError(
                        f"scatter: sendbuf dtype {send.dtype} differs from recvbuf dtype {out.dtype}")
                _, total = typed_count(send, dtype, "scatter: sendbuf")
                want = self._elems(Coll.scatter, n, root)[0]
                if total != want:
                    raise InvalidArgumentError(
                        f"scatter: sendbuf has {total} elements, expected {want} ({self.size} ranks x {n})")
        return self._run(Coll.scatter, address(send) if send is not None else 0, address(out), n, dt,
                         root=root, algo=algo, timeout=timeout, async_op=async_op, result=recvbuf,
                         keep=(sendbuf, recvbuf, send, out))

    def barrier(self, *, async_op=False, timeout=None):
        return self._run(Coll.barrier, 0, 0, 0, DataType.uint8, timeout=timeout, async_op=async_op)

    def _p2p(self, what, peer, tag):
        peer = check_int(peer, f"{what}: peer", 0, self.size - 1)
        if peer == self.rank:
            raise InvalidArgumentError(f"{what}: peer {peer} is this rank (allowed: another rank in [0, "
                                       f"{self.size - 1}])")
        return peer, check_int(tag, f"{what}: tag", 0, MAX_TAG)

    def send(self, buf, peer: int, tag: int = 0, *, dtype=None, async_op=False, timeout=None):
        """Send buf to `peer`. Messages between two ranks arrive in order; count, dtype and tag must match the
        receiver's. tag: an integer in [0, 2**32)."""
        peer, tag = self._p2p("send", peer, tag)
        arr = as_array(buf, "send: buf")
        dt, n = typed_count(arr, dtype, "send: buf")
        return self._run(Coll.send, address(arr), 0, n, dt, peer=peer, tag=tag, timeout=timeout,
                         async_op=async_op, result=None, keep=(buf, arr))

    def recv(self, buf, peer: int, tag: int = 0, *, dtype=None, async_op=False, timeout=None):
        """Receive into buf from `peer`."""
        peer, tag = self._p2p("recv", peer, tag)
        arr = as_array(buf, "recv: buf", writable=True)
        dt, n = typed_count(arr, dtype, "recv: buf")
        return self._run(Coll.recv, 0, address(arr), n, dt, peer=peer, tag=tag, timeout=timeout,
                         async_op=async_op, result=buf, keep=(buf, arr))

    # -- lifetime ----------------------------------------------------------------------
    def split(self, color: int, key: int | None = None) -> Optional["Communicator"]:
        """Collective: ranks with equal color form a new communicator ordered by (key, rank).
        color < 0 (e.g. harp.UNDEFINED) returns None on that rank."""
        color = check_int(color, "split: color", *INT32)
        key = check_int(self.rank if key is None else key, "split: key", *INT32)
        impl = self._c.split(color, key)
        return None if impl is None else Communicator(0, 0, _impl=impl)

    def abort(self, reason: str = "abort requested"):
        """Break the communicator on every rank: their pending and later calls raise PeerError.
        The collective in flight here may still complete on peers whose data had all arrived
        (MPI ULFM / NCCL semantics); it fails on this rank, and no later one completes anywhere."""
        self._c.abort(reason)

    def destroy(self):
        """Finish queued work, say goodbye to peers and free resources, including the
        connection to the bootstrap store (closed at once). Idempotent."""
        self._c.destroy()

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __repr__(self):
        return f"<harp.Communicator rank {self.rank} of {self.size}>"

    # -- fault tolerance (core/engine/communicator_ft.cc) ------------------------
    def revoke(self):
        """Break the communicator on every rank: every pending and later operation raises
        RevokedError (a PeerError). Not collective; any thread."""
        self._c.revoke()

    @property
    def revoked(self) -> bool:
        return self._c.revoked

    def failed_ranks(self) -> list:
        """Ranks this rank's keep-alive found dead, frozen or cut off (HARP_KEEPALIVE_TIMEOUT)."""
        return list(self._c.failed_ranks())

    def agree(self, flag: bool = True):
        """Fault-tolerant agreement among the survivors: ``(AND of their flags, sorted failed ranks)``,
        the same on every rank that returns. Completes when ranks die during it. Runs through the
        bootstrap store, whose host (the launcher, or the process that made the unique id) must live."""
        ok, failed = self._c.agree(bool(flag))
        return bool(ok), list(failed)

    def shrink(self, exclude: Optional[Sequence[int]] = None) -> "Communicator":
        """Collective over the survivors: a new communicator without ``exclude`` (None: the failed
        set of ``agree()``); ranks renumbered contiguously in old-rank order. New connections."""
        ex = None if exclude is None else [check_int(r, "shrink: exclude", 0, self.size - 1) for r in exclude]
        return Communicator(0, 0, _impl=self._c.shrink(ex))

    def grow(self, new_size: int, unique_id=None) -> "Communicator":
        """Collective over this communicator and the joiners: a communicator of ``new_size`` ranks;
        current ranks keep their numbers, joiners call ``harp.Communicator(rank, new_size, unique_id)``
        with rank >= size. Rank 0 passes a fresh ``harp.get_unique_id()`` (the others may pass None)."""
        new_size = check_int(new_size, "grow: new_size", self.size + 1, 2**31 - 1)
        uid = None if unique_id is None else _uid_bytes(unique_id, "grow: unique_id")
        return Communicator(0, 0, _impl=self._c.grow(new_size, uid))

    # -- coalesced collectives (harp/coalesce.py) ------------------------------
    def allreduce_coalesced(self, tensors, op="sum", *, async_op=False, timeout=None):
        """Allreduce every array of `tensors` in place, small ones fused into few collectives
        (HARP_FUSION_BYTES staging, one group per dtype); returns the list, or a CoalescedWork
        with async_op=True (results in place once wait() returns). Lists that differ between
        ranks raise MismatchError on every rank. See harp.coalesce."""
        from . import coalesce
        return coalesce.allreduce_coalesced(self, tensors, op, async_op=async_op, timeout=timeout)


class UniqueId:
    """128 opaque bytes that identify a job's bootstrap root (like ncclUniqueId).

    Lifetime: the object that ``get_unique_id()`` returns owns the bootstrap store it created.
    Dropping it (its last reference) stops the store at once if no rank is connected, else once
    the last rank disconnects; a communicator keeps the store alive for its whole life (split,
    shrink, grow and agree rendezvous through it), whether or not the id object lives. So keep
    the id until every rank has joined. Copies (``UniqueId(bytes)``, ``from_hex``, pickles) do
    not own the store."""

    def __init__(self, data: bytes):
        if len(data) != 128:
            raise InvalidArgumentError(f"a HARP unique id has 128 bytes, got {len(data)}")
        self.bytes = bytes(data)

    def hex(self) -> str:
        return self.bytes.hex()

    @classmethod
    def from_hex(cls, s: str) -> "UniqueId":
        try:
            return cls(bytes.fromhex(s))
        except ValueError as e:
            raise InvalidArgumentError(f"not a hex-encoded HARP unique id: {e}") from None

    @property
    def address(self) -> str:
        return _harp.unique_id_address(self.bytes)

    def release(self) -> bool:
        """Stop the bootstrap store this process serves for this id now (for an id that will not
        be used, or no longer). False if this process serves none for it."""
        return _harp.release_unique_id(self.bytes)

    def __bytes__(self):
        return self.bytes

    def __reduce__(self):
        return UniqueId, (self.bytes,)  # a copy elsewhere does not own this process's store


def get_unique_id(bind: str = "") -> UniqueId:
    """Create a unique id (a random 32-byte secret and the address of a bootstrap store that
    this process serves). The store stops by itself once the communicator it served has formed
    and every rank has disconnected (destroy()), or when the returned object is dropped and no
    rank is connected (see UniqueId); ``UniqueId.release()`` stops it now.
    A unique id serves one communicator."""
    uid = UniqueId(_harp.get_unique_id(bind))
    weakref.finalize(uid, _harp.drop_unique_id, uid.bytes).atexit = False
    return uid
