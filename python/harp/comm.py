"""harp.Communicator — the Python face of a HARP communicator.

Every rank creates one with the same unique id (or through ``harp.init()``,
which reads the launcher's environment) and then calls the same collectives in
the same order. Buffers are numpy arrays or anything with the buffer protocol
or DLPack (CPU). Collectives with an output take ``recvbuf``; when it is None
the operation is in place where that makes sense (allreduce, broadcast,
reduce at the root) or a new array is returned (allgather, gather, ...).

``async_op=True`` returns a :class:`Work`; its ``wait()`` returns the output.
Collectives complete in issue order. The GIL is released while HARP works.
Blocking allreduce/broadcast on plain C-contiguous numpy arrays are checked
and started in C (``_harp.run_arrays``, about 1 us per call); every other
call takes the general path below, which also words the errors.

Threading: a Communicator may be shared between threads, but all ranks must
issue collectives in the same order, so order your threads' calls yourself.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import _harp
from ._buffers import address, as_array
from ._harp import run_arrays as _run_arrays
from ._types import OP_CODES, Coll, DataType, ReduceOp, dtype_of, parse_op
from .errors import InvalidArgumentError

_ALLREDUCE = int(Coll.allreduce)
_op_code = OP_CODES.get


class Work:
    """Handle of an asynchronous collective."""

    def __init__(self, work, result, keep):
        self._work = work
        self._result = result
        self._keep = keep  # buffers stay alive until the work is done

    def wait(self, timeout: Optional[float] = None):
        """Block until done (raises the collective's error); returns the output buffer.

        With a timeout, raises TimeoutError if not done by then (the work goes on)."""
        if not self._work.wait(-1.0 if timeout is None else float(timeout)):
            raise TimeoutError(f"collective not finished after {timeout} s")
        self._keep = None
        return self._result

    def test(self) -> bool:
        """True when finished (successfully or not). Never blocks."""
        return self._work.test()

    def is_completed(self) -> bool:
        return self._work.test()

    @property
    def error(self) -> str:
        return self._work.error()

    @property
    def result(self):
        return self._result


_claimed: set = set()  # (unique id, rank) pairs this process has joined


def _claim(uid: bytes, rank):
    """One unique id, one communicator: refuse a second join of the same (id, rank) in this process
    at once (the store refuses it across processes, core/rendezvous.h)."""
    key = (bytes(uid), int(rank) if isinstance(rank, int) else rank)
    if key in _claimed:
        raise InvalidArgumentError(
            f"this process already joined a communicator as rank {rank} with this unique id: a unique id serves "
            "one communicator; create a new one (harp.get_unique_id()) for each communicator, and call harp.init() "
            "once per process")
    _claimed.add(key)


class Communicator:
    def __init__(self, rank: int, size: int, unique_id: bytes | None = None, *, timeout: float | None = None,
                 transport: str | None = None, _impl=None):
        if _impl is not None:
            self._c = _impl
            return
        if unique_id is None:
            raise InvalidArgumentError("Communicator needs a unique_id (harp.get_unique_id()) or use harp.init()")
        uid = unique_id.bytes if isinstance(unique_id, UniqueId) else bytes(unique_id)
        _claim(uid, rank)
        self._c = _harp.Comm(uid, int(rank), int(size), -1.0 if timeout is None else float(timeout),
                             transport or "")

    @classmethod
    def from_store(cls, store, rank: int, size: int, *, prefix: str = "harp/", timeout: float | None = None,
                   transport: str | None = None) -> "Communicator":
        """Rendezvous through a key-value store (an object with set/get/add, e.g. an adapter
        over torch.distributed.Store)."""
        impl = _harp.Comm.from_store(store, prefix, int(rank), int(size), -1.0 if timeout is None else float(timeout),
                                     transport or "")
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
        return self._c.transport_name(int(peer))

    def algorithm(self, collective: str, count: int, dtype="float32") -> str:
        """The algorithm the tuning table (and HARP_ALGO) picks for this call."""
        from ._types import parse_dtype

        return self._c.choose_algorithm(int(Coll[collective]), int(count), int(parse_dtype(dtype)))

    @property
    def broken(self) -> bool:
        return self._c.broken

    # -- plumbing ---------------------------------------------------------------------
    def _run(self, coll, send, recv, count, dt, *, op=ReduceOp.SUM, root=0, peer=-1, tag=0, algo=None,
             timeout=None, async_op=False, result=None, keep=(), v=None):
        if not async_op and v is None and peer < 0 and timeout is None:
            self._c.run(int(coll), send, recv, int(count), int(dt), int(op), int(root), algo or "")
            return result
        sc, sd, rc, rd = v if v is not None else ([], [], [], [])
        w = self._c.submit(int(coll), send, recv, int(count), int(dt), int(op), int(root), int(peer), int(tag),
                           algo or "", -1.0 if timeout is None else float(timeout), bool(async_op), sc, sd, rc, rd)
        if async_op:
            return Work(w, result, keep)
        return result

    def _fast(self, coll, sendbuf, recvbuf, op, root, dtype, async_op, algo, timeout) -> bool:
        """The common blocking call on plain numpy arrays, checked and run in C++ (about 0.3 us
        instead of 5-10). False when the call needs the general path below (which also words
        any error)."""
        if dtype is not None or async_op or timeout is not None:
            return False
        try:
            code = _op_code(op)
        except TypeError:  # unhashable op: let parse_op word the error
            return False
        return code is not None and _run_arrays(self._c, coll, sendbuf, recvbuf, code, root, algo)

    def _check_root(self, root):
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise InvalidArgumentError(f"root {root} is out of range for {self.size} ranks")
        return int(root)

    def _out(self, recvbuf, like: np.ndarray, count: int, what: str, shape=None):
        """A writable output of `count` elements of like's dtype (allocated when None)."""
        if recvbuf is None:
            return np.empty(shape if shape is not None else (count,), dtype=like.dtype)
        out = as_array(recvbuf, f"{what}: recvbuf", writable=True)
        if out.dtype != like.dtype:
            raise InvalidArgumentError(f"{what}: recvbuf dtype {out.dtype} differs from sendbuf dtype {like.dtype}")
        if out.size != count:
            raise InvalidArgumentError(f"{what}: recvbuf has {out.size} elements, expected {count}")
        return out

    # -- collectives -------------------------------------------------------------------
    def allreduce(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, async_op=False, algo=None, timeout=None):
        """Reduce across ranks; every rank gets the result. In place when recvbuf is None."""
        # _fast() written out: the call is the whole cost of a small allreduce (0.47 -> 0.27 us).
        if dtype is None and timeout is None and not async_op:
            try:
                code = _op_code(op)
            except TypeError:  # unhashable op: let parse_op word the error
                code = None
            if code is not None and _run_arrays(self._c, _ALLREDUCE, sendbuf, recvbuf, code, 0, algo):
                return recvbuf if recvbuf is not None else sendbuf
        send = as_array(sendbuf, "allreduce: sendbuf", writable=recvbuf is None)
        dt = dtype_of(send, dtype)
        out = send if recvbuf is None else self._out(recvbuf, send, send.size, "allreduce")
        result = recvbuf if recvbuf is not None else sendbuf
        return self._run(Coll.allreduce, address(send), address(out), send.size, dt, op=parse_op(op), algo=algo,
                         timeout=timeout, async_op=async_op, result=result, keep=(send, out))

    def broadcast(self, buf, root: int = 0, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Copy root's buf to every rank's buf (in place)."""
        if type(root) is int and 0 <= root < self.size and self._fast(Coll.broadcast, buf, None, 0, root, dtype,
                                                                         async_op, algo, timeout):
            return buf
        root = self._check_root(root)
        arr = as_array(buf, "broadcast: buf", writable=True)
        dt = dtype_of(arr, dtype)
        return self._run(Coll.broadcast, address(arr), address(arr), arr.size, dt, root=root, algo=algo,
                         timeout=timeout, async_op=async_op, result=buf, keep=(arr,))

    def reduce(self, sendbuf, recvbuf=None, op="sum", root: int = 0, *, dtype=None, async_op=False, algo=None,
               timeout=None):
        """Reduce to root. recvbuf (root only) defaults to sendbuf (in place at the root)."""
        if type(root) is int and 0 <= root < self.size and self._fast(Coll.reduce, sendbuf, recvbuf, op, root, dtype,
                                                                         async_op, algo, timeout):
            return (recvbuf if recvbuf is not None else sendbuf) if self.rank == root else None
        root = self._check_root(root)
        is_root = self.rank == root
        send = as_array(sendbuf, "reduce: sendbuf", writable=is_root and recvbuf is None)
        dt = dtype_of(send, dtype)
        out = None
        if is_root:
            out = send if recvbuf is None else self._out(recvbuf, send, send.size, "reduce")
        result = (recvbuf if recvbuf is not None else sendbuf) if is_root else None
        return self._run(Coll.reduce, address(send), address(out) if out is not None else 0, send.size, dt,
                         op=parse_op(op), root=root, algo=algo, timeout=timeout, async_op=async_op, result=result,
                         keep=(send, out))

    def allgather(self, sendbuf, recvbuf=None, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Concatenate every rank's sendbuf, in rank order. New array of shape (size, *sendbuf.shape)
        when recvbuf is None."""
        out = recvbuf
        if out is None and type(sendbuf) is np.ndarray:
            out = np.empty((self.size,) + sendbuf.shape, sendbuf.dtype)
        if self._fast(Coll.allgather, sendbuf, out, "sum", 0, dtype, async_op, algo, timeout):
            return out
        send = as_array(sendbuf, "allgather: sendbuf")
        dt = dtype_of(send, dtype)
        out = self._out(recvbuf, send, send.size * self.size, "allgather", shape=(self.size,) + send.shape)
        return self._run(Coll.allgather, address(send), address(out), send.size, dt, algo=algo, timeout=timeout,
                         async_op=async_op, result=out if recvbuf is None else recvbuf, keep=(send, out))

    def reduce_scatter(self, sendbuf, recvbuf=None, op="sum", *, dtype=None, async_op=False, algo=None,
                       timeout=None):
        """Reduce sendbuf (size × n elements) across ranks; rank r gets block r (n elements)."""
        out = recvbuf
        if out is None and type(sendbuf) is np.ndarray and sendbuf.size % self.size == 0:
            out = np.empty(sendbuf.size // self.size, sendbuf.dtype)
        if self._fast(Coll.reduce_scatter, sendbuf, out, op, 0, dtype, async_op, algo, timeout):
            return out
        send = as_array(sendbuf, "reduce_scatter: sendbuf")
        dt = dtype_of(send, dtype)
        if send.size % self.size:
            raise InvalidArgumentError(
                f"reduce_scatter: sendbuf has {send.size} elements, not a multiple of {self.size} ranks")
        n = send.size // self.size
        out = self._out(recvbuf, send, n, "reduce_scatter")
        return self._run(Coll.reduce_scatter, address(send), address(out), n, dt, op=parse_op(op), algo=algo,
                         timeout=timeout, async_op=async_op, result=out if recvbuf is None else recvbuf,
                         keep=(send, out))

    def alltoall(self, sendbuf, recvbuf=None, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Block q of sendbuf goes to rank q; block q of recvbuf comes from rank q (equal blocks)."""
        out = recvbuf
        if out is None and type(sendbuf) is np.ndarray:
            out = np.empty(sendbuf.shape, sendbuf.dtype)
        if self._fast(Coll.alltoall, sendbuf, out, "sum", 0, dtype, async_op, algo, timeout):
            return out
        send = as_array(sendbuf, "alltoall: sendbuf")
        dt = dtype_of(send, dtype)
        if send.size % self.size:
            raise InvalidArgumentError(
                f"alltoall: sendbuf has {send.size} elements, not a multiple of {self.size} ranks")
        out = self._out(recvbuf, send, send.size, "alltoall", shape=send.shape)
        return self._run(Coll.alltoall, address(send), address(out), send.size // self.size, dt, algo=algo,
                         timeout=timeout, async_op=async_op, result=out if recvbuf is None else recvbuf,
                         keep=(send, out))

    def alltoallv(self, sendbuf, sendcounts: Sequence[int], recvbuf, recvcounts: Sequence[int],
                  sdispls: Sequence[int] | None = None, rdispls: Sequence[int] | None = None, *, dtype=None,
                  async_op=False, timeout=None):
        """Alltoall with per-rank counts (elements); displacements default to packed."""
        send = as_array(sendbuf, "alltoallv: sendbuf")
        out = as_array(recvbuf, "alltoallv: recvbuf", writable=True)
        dt = dtype_of(send, dtype)
        p = self.size
        sc, rc = [int(x) for x in sendcounts], [int(x) for x in recvcounts]
        if len(sc) != p or len(rc) != p:
            raise InvalidArgumentError(f"alltoallv: sendcounts and recvcounts need {p} entries")
        sd = [int(x) for x in sdispls] if sdispls is not None else list(np.cumsum([0] + sc[:-1]))
        rd = [int(x) for x in rdispls] if rdispls is not None else list(np.cumsum([0] + rc[:-1]))
        if any(c < 0 for c in sc + rc + sd + rd):
            raise InvalidArgumentError("alltoallv: counts and displacements must be >= 0")
        if max((d + c for d, c in zip(sd, sc)), default=0) > send.size:
            raise InvalidArgumentError("alltoallv: sendcounts/sdispls reach past the end of sendbuf")
        if max((d + c for d, c in zip(rd, rc)), default=0) > out.size:
            raise InvalidArgumentError("alltoallv: recvcounts/rdispls reach past the end of recvbuf")
        if out.dtype != send.dtype:
            raise InvalidArgumentError(f"alltoallv: recvbuf dtype {out.dtype} differs from sendbuf dtype {send.dtype}")
        return self._run(Coll.alltoallv, address(send), address(out), 0, dt, timeout=timeout, async_op=async_op,
                         result=recvbuf, keep=(send, out), v=(sc, [int(x) for x in sd], rc, [int(x) for x in rd]))

    def gather(self, sendbuf, recvbuf=None, root: int = 0, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Root receives every rank's sendbuf in rank order; returns it at the root, None elsewhere."""
        root = self._check_root(root)
        send = as_array(sendbuf, "gather: sendbuf")
        dt = dtype_of(send, dtype)
        out = None
        if self.rank == root:
            out = self._out(recvbuf, send, send.size * self.size, "gather", shape=(self.size,) + send.shape)
        result = (out if recvbuf is None else recvbuf) if out is not None else None
        return self._run(Coll.gather, address(send), address(out) if out is not None else 0, send.size, dt,
                         root=root, algo=algo, timeout=timeout, async_op=async_op, result=result, keep=(send, out))

    def scatter(self, sendbuf, recvbuf, root: int = 0, *, dtype=None, async_op=False, algo=None, timeout=None):
        """Block q of root's sendbuf goes to rank q's recvbuf (sendbuf ignored elsewhere)."""
        root = self._check_root(root)
        out = as_array(recvbuf, "scatter: recvbuf", writable=True)
        dt = dtype_of(out, dtype)
        send = None
        if self.rank == root:
            send = as_array(sendbuf, "scatter: sendbuf")
            if send.dtype != out.dtype:
                raise InvalidArgumentError(f"scatter: sendbuf dtype {send.dtype} differs from recvbuf dtype {out.dtype}")
            if send.size != out.size * self.size:
                raise InvalidArgumentError(
                    f"scatter: sendbuf has {send.size} elements, expected {out.size * self.size} "
                    f"({self.size} ranks x {out.size})")
        return self._run(Coll.scatter, address(send) if send is not None else 0, address(out), out.size, dt,
                         root=root, algo=algo, timeout=timeout, async_op=async_op, result=recvbuf, keep=(send, out))

    def barrier(self, *, async_op=False, timeout=None):
        return self._run(Coll.barrier, 0, 0, 0, DataType.uint8, timeout=timeout, async_op=async_op)

    def send(self, buf, peer: int, tag: int = 0, *, dtype=None, async_op=False, timeout=None):
        """Send buf to `peer`. Messages between two ranks arrive in order; count, dtype and tag must match the
        receiver's."""
        arr = as_array(buf, "send: buf")
        return self._run(Coll.send, address(arr), 0, arr.size, dtype_of(arr, dtype), peer=int(peer), tag=int(tag),
                         timeout=timeout, async_op=async_op, result=None, keep=(arr,))

    def recv(self, buf, peer: int, tag: int = 0, *, dtype=None, async_op=False, timeout=None):
        """Receive into buf from `peer`."""
        arr = as_array(buf, "recv: buf", writable=True)
        return self._run(Coll.recv, 0, address(arr), arr.size, dtype_of(arr, dtype), peer=int(peer), tag=int(tag),
                         timeout=timeout, async_op=async_op, result=buf, keep=(arr,))

    # -- lifetime ----------------------------------------------------------------------
    def split(self, color: int, key: int | None = None) -> Optional["Communicator"]:
        """Collective: ranks with equal color form a new communicator ordered by (key, rank).
        color < 0 (e.g. harp.UNDEFINED) returns None on that rank."""
        impl = self._c.split(int(color), int(self.rank if key is None else key))
        return None if impl is None else Communicator(0, 0, _impl=impl)

    def abort(self, reason: str = "abort requested"):
        """Break the communicator on every rank: their pending and later calls raise PeerError."""
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


class UniqueId:
    """128 opaque bytes that identify a job's bootstrap root (like ncclUniqueId)."""

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


def get_unique_id(bind: str = "") -> UniqueId:
    """Create a unique id (a random 32-byte secret and the address of a bootstrap store that
    this process serves). The store stops by itself once the communicator it served has formed
    and every rank has disconnected (destroy()); ``UniqueId.release()`` stops it earlier.
    A unique id serves one communicator."""
    return UniqueId(_harp.get_unique_id(bind))
