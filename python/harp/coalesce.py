"""harp.coalesce — one allreduce over a list of arrays (tensor fusion).

Usage::

    comm.allreduce_coalesced([w1, b1, w2, b2], op="sum")        # in place, blocking
    work = comm.allreduce_coalesced(grads, async_op=True)
    ...                                                           # overlap with other work
    work.wait()                                                   # results are in `grads` now

Every array (numpy, buffer protocol or CPU DLPack, C-contiguous and writable)
is reduced in place, as if ``comm.allreduce(a, op=op)`` ran on each, in one of
two ways (HARP_COALESCE):

``sg`` (default): the arrays of each dtype go to the core as a list, reduced by
one ring schedule that sends every array's blocks from and into the arrays
themselves (core/algorithms/allreduce_coalesced_ring.cc): no packing copies,
2(p-1) steps for the whole list. Integer avg, which the core refuses in a list
(it widens the data), runs array by array.

``fuse``: small arrays travel together: arrays of one dtype are packed, in list order, into a
fusion buffer, reduced by one allreduce per buffer, and copied back. Mixed
dtypes form one group each (in order of first appearance). An array of at
least HARP_FUSION_ALONE_BYTES (default 128K), or of half of HARP_FUSION_BYTES,
travels alone, in place: copying it in and out would cost more than the
per-call overhead fusion saves (4 loopback ranks under load, 32 MB of 4K-2M
arrays: all fused 1.42x one flat allreduce, arrays >= 128K alone 0.75x; arena
1 Gbit/s: 1.17x and 1.14x; bench/RESULTS-vpc.md). Those reductions are queued
back to back. Groups longer than half the fusion buffer are cut into chunks
that alternate between its two halves, so packing chunk i+1 and unpacking
chunk i-1 overlap the reduction of chunk i. HARP_FUSION_BYTES (default 64M) bounds
the staging memory of a communicator; 0 sends every array alone (still one
list call, reductions queued back to back).

Agreement: every rank must pass lists with the same length, dtypes and
element counts, in the same order, and the same op. One 16-byte allreduce of
the list's signature checks that first; ranks that disagree all raise
:class:`~harp.errors.MismatchError` before any array is touched, and the
communicator stays usable (every rank knows).

Async: ``async_op=True`` queues the reductions and returns a
:class:`CoalescedWork`; the arrays hold the results once ``wait()`` returns
(or ``test()`` returned True): fused chunks are copied back by that call. The
communicator owns the arrays and the fusion buffer until then; the next
coalesced call on the communicator first finishes an unfinished one.

Threading: like the communicator's other calls (ranks issue them in the
same order; one thread at a time per communicator).
"""
from __future__ import annotations

import collections
import hashlib
import struct

import numpy as np

from . import _params
from ._buffers import address, as_array
from ._types import Coll, dtype_of, parse_op
from ._work import _seconds, wait_seconds
from .errors import InvalidArgumentError, MismatchError

_ALIGN = 64


def fusion_bytes(name: str = "HARP_FUSION_BYTES") -> int:
    """HARP_FUSION_BYTES (or another size parameter) in bytes (binary units, like every HARP_* size)."""
    text = _params.get(name).strip()
    units = {"": 1, "B": 1, "K": 1 << 10, "k": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
             "G": 1 << 30, "GB": 1 << 30}
    num = text.rstrip("BKkMG")
    try:
        value, mult = float(num), units[text[len(num):]]
    except (ValueError, KeyError):
        raise InvalidArgumentError(f"{name}: '{text}' is not a size (use e.g. 0, 4M, 64M)") from None
    if not value >= 0 or value * mult >= 2 ** 62:
        raise InvalidArgumentError(f"{name}: '{text}' is out of range")
    return int(value * mult)


class _Chunk:
    """Part of one dtype group: (array, first element, elements) pieces packed back to back."""

    __slots__ = ("dt", "npdt", "pieces", "count", "half")

    def __init__(self, dt, npdt):
        self.dt, self.npdt, self.pieces, self.count, self.half = dt, npdt, [], 0, 0


def mode() -> str:
    """HARP_COALESCE, checked: "sg" or "fuse" (InvalidArgumentError naming the value otherwise)."""
    m = _params.get("HARP_COALESCE").strip().lower()
    bad = _params.check_value(_params.declared("HARP_COALESCE"), m)
    if bad:
        raise InvalidArgumentError(f"HARP_COALESCE={m!r}: {bad}")
    return m


def _plan_sg(arrays, dts, code):
    """Items in issue order: ('list', [indices]) per dtype, or ('direct', index) for integer avg."""
    from ._types import ReduceOp
    groups = {}
    for i, a in enumerate(arrays):
        if a.size:
            groups.setdefault(dts[i], []).append(i)
    items = []
    for dt, idx in groups.items():
        if code == ReduceOp.AVG and np.issubdtype(arrays[idx[0]].dtype, np.integer):
            items.extend(("direct", i) for i in idx)
        else:
            items.append(("list", idx))
    return items


def _plan(arrays, dts, half_bytes, alone_bytes):
    """Items in issue order: ('direct', index) or ('chunk', _Chunk)."""
    groups = {}  # dt -> [indices], insertion-ordered by first appearance
    for i, a in enumerate(arrays):
        if a.size:
            groups.setdefault(dts[i], []).append(i)
    items = []
    for dt, idx in groups.items():
        npdt = arrays[idx[0]].dtype
        cap = half_bytes // npdt.itemsize  # elements per chunk
        cur = None
        for i in idx:
            a = arrays[i]
            if cap == 0 or a.nbytes >= half_bytes or a.nbytes >= alone_bytes:
                items.append(("direct", i))
                continue
            start = 0
            while start < a.size:
                if cur is None or cur.count == cap:
                    cur = _Chunk(dt, npdt)
                    items.append(("chunk", cur))
                n = min(a.size - start, cap - cur.count)
                cur.pieces.append((i, start, n))
                cur.count += n
                start += n
    return items


def _signature(arrays, dts, code) -> int:
    """A 62-bit hash of (op, [(dtype, count)...]): equal on every rank exactly when the lists agree."""
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<qq", int(code), len(arrays)))
    for a, dt in zip(arrays, dts):
        h.update(struct.pack("<qq", int(dt), int(a.size)))
    return int.from_bytes(h.digest(), "little") & ((1 << 62) - 1)


def _agree(comm, arrays, dts, code, timeout):
    """Every rank raises MismatchError when any rank's list or op differs from another's."""
    if comm.size == 1:
        return
    sig = _signature(arrays, dts, code)
    both = np.array([sig, -sig], dtype=np.int64)
    comm.allreduce(both, op="max", timeout=timeout)
    if both[0] != -both[1]:
        shapes = ", ".join(f"{a.dtype}[{a.size}]" for a in arrays[:8]) + (", ..." if len(arrays) > 8 else "")
        raise MismatchError(
            f"allreduce_coalesced: ranks passed different tensor lists or ops (count, order, dtypes or element "
            f"counts differ); rank {comm.rank} has {len(arrays)} tensors [{shapes}] with op {code.name}")


class FusionState:
    """One communicator's fusion buffer (CallLayer.fusion): two staging halves, grown on demand,
    so one chunk is copied in while the other is reduced; `current` is the unfinished
    CoalescedWork they belong to (a new coalesced call waits for it first)."""

    __slots__ = ("buffers", "current", "_sizes")

    def __init__(self):
        self.buffers = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
        self.current = None
        self._sizes = None

    def sizes(self):
        """(half of HARP_FUSION_BYTES, HARP_FUSION_ALONE_BYTES), read on first use."""
        if self._sizes is None:
            self._sizes = (fusion_bytes() // 2, fusion_bytes("HARP_FUSION_ALONE_BYTES"))
        return self._sizes

    def set_sizes(self, half=None, alone=None):
        """Staging half and alone threshold in bytes for later calls (benchmarks sweep them);
        None: back to HARP_FUSION_BYTES / 2 and HARP_FUSION_ALONE_BYTES."""
        self._sizes = None if half is None else (int(half), int(alone))


class CoalescedWork:
    """Handle of an asynchronous allreduce_coalesced; ``wait()`` returns the list of arrays."""

    def __init__(self, comm, arrays, result, items, code, secs, inline=False):
        self._comm, self._arrays, self._result = comm, arrays, result
        self._calls = comm.calls
        self._fusion = comm.calls.fusion  # FusionState: the two staging halves, this work's while it runs
        self._items, self._code, self._secs = items, code, secs
        self._inline = inline  # blocking call of one collective: run it on this thread
        self._flight = collections.deque()  # (core work, _Chunk or None), oldest first
        self._done = False
        self._error = None

    # -- issuing ------------------------------------------------------------------------------
    def _issue(self):
        bufs = self._fusion.buffers
        busy = 0  # chunks in flight (each holds one half of the fusion buffer)
        for kind, what in self._items:
            if kind == "direct":
                a = self._arrays[what]
                self._submit(address(a), a.size, int(dtype_of(a)), None)
                continue
            if kind == "list":
                arrs = [self._arrays[i] for i in what]
                addrs = [address(a) for a in arrs]
                w = self._calls.core.submit_coalesced(addrs, addrs, [a.size for a in arrs], int(dtype_of(arrs[0])),
                                                   int(self._code), "", self._secs, not self._inline)
                self._flight.append((w, None))
                self._calls.hold(w, (self._arrays,))
                continue
            while busy >= 2:
                busy -= self._retire()
            what.half = self._free_half(bufs)
            view = self._staging(bufs, what)
            off = 0
            for i, start, n in what.pieces:
                view[off:off + n] = self._arrays[i].reshape(-1)[start:start + n]
                off += n
            self._submit(address(view), what.count, int(what.dt), what)
            busy += 1

    def _free_half(self, bufs):
        used = {c.half for _, c in self._flight if c is not None}
        return 0 if 0 not in used else 1

    def _staging(self, bufs, chunk):
        need = chunk.count * chunk.npdt.itemsize
        if bufs[chunk.half].nbytes < need:
            bufs[chunk.half] = np.empty(-(-need // _ALIGN) * _ALIGN, dtype=np.uint8)
        return bufs[chunk.half][:need].view(chunk.npdt)

    def _submit(self, addr, count, dt, chunk):
        calls = self._calls
        w = calls.core.submit(int(Coll.allreduce), addr, addr, int(count), dt, int(self._code), 0, -1, 0, "",
                           self._secs, not self._inline, [], [], [], [])
        self._flight.append((w, chunk))
        calls.hold(w, (self._arrays, self._fusion.buffers))

    def _retire(self) -> int:
        """Wait for the oldest reduction, copy a chunk back; 1 when it freed a half of the buffer."""
        w, chunk = self._flight[0]
        w.wait(-1.0)
        self._flight.popleft()
        if chunk is None:
            return 0
        view = self._fusion.buffers[chunk.half][:chunk.count * chunk.npdt.itemsize].view(chunk.npdt)
        off = 0
        for i, start, n in chunk.pieces:
            self._arrays[i].reshape(-1)[start:start + n] = view[off:off + n]
            off += n
        return 1

    def _finish(self):
        try:
            while self._flight:
                self._retire()
        except BaseException as e:
            self._error = e
            self._drop()
            raise
        finally:
            if self._fusion.current is self:
                self._fusion.current = None
        self._done = True

    def _drop(self):
        """After a failure: wait (bounded by each call's timeout) for what is still queued, keep the error."""
        while self._flight:
            try:
                self._flight.popleft()[0].wait(-1.0)
            except Exception:  # noqa: BLE001 - the first error is the one reported
                pass

    # -- Work API --------------------------------------------------------------------------------
    def wait(self, timeout=None):
        """Block until every reduction finished and the results are in the arrays; returns the list.
        timeout: seconds to wait for the reductions (TimeoutError if not done; call wait again)."""
        secs = wait_seconds(timeout, "CoalescedWork.wait: timeout")  # checked whether or not it is needed
        if self._error is not None:
            raise self._error
        if not self._done:
            if timeout is not None:
                for w, _ in list(self._flight):
                    if not w.wait(secs):
                        raise TimeoutError(f"allreduce_coalesced not finished after {timeout} s")
            self._finish()
        return self._result

    def test(self) -> bool:
        """True when finished (the results are then in the arrays). Never blocks on the network."""
        if self._done or self._error is not None:
            return True
        if all(w.test() for w, _ in self._flight):
            try:
                self._finish()
            except Exception:  # noqa: BLE001 - wait() raises it
                pass
            return True
        return False

    is_completed = test

    @property
    def result(self):
        return self._result


def allreduce_coalesced(comm, tensors, op="sum", *, async_op=False, timeout=None):
    """comm.allreduce_coalesced (see the module doc)."""
    secs = _seconds(timeout)
    code = parse_op(op)
    if isinstance(tensors, (np.ndarray, bytes, bytearray, memoryview)) or hasattr(tensors, "__dlpack__"):
        raise InvalidArgumentError("allreduce_coalesced: tensors must be a list of arrays, got one "
                                   f"{type(tensors).__name__} (use comm.allreduce for a single array)")
    try:
        result = list(tensors)
    except TypeError:
        raise InvalidArgumentError(
            f"allreduce_coalesced: tensors must be a list of arrays, got {type(tensors).__name__}") from None
    arrays = [as_array(t, f"allreduce_coalesced: tensors[{i}]", writable=True) for i, t in enumerate(result)]
    dts = []
    for i, a in enumerate(arrays):
        try:
            dts.append(dtype_of(a))
        except ValueError as e:
            raise InvalidArgumentError(f"allreduce_coalesced: tensors[{i}]: {e}") from None
    calls = comm.calls
    state = calls.fusion
    if state is None:
        state = calls.fusion = FusionState()
    if state.current is not None:
        state.current.wait()
    calls.settle()
    _agree(comm, arrays, dts, code, timeout)
    if mode() == "fuse":
        half, alone = state.sizes()
        items = _plan(arrays, dts, half, alone)
    else:
        items = _plan_sg(arrays, dts, code)
    work = CoalescedWork(comm, arrays, result, items, code, secs, inline=not async_op and len(items) == 1)
    state.current = work
    try:
        work._issue()
    except BaseException as e:
        work._error = e
        work._drop()
        state.current = None
        raise
    if async_op:
        return work
    work.wait()
    return result


__all__ = ["allreduce_coalesced", "CoalescedWork", "FusionState", "fusion_bytes"]
