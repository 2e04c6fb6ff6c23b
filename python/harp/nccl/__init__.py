"""harp.nccl — the ``cupy.cuda.nccl`` API, served by HARP.

Code written for CuPy's NCCL wrapper runs by changing one import::

    from harp import nccl            # instead of: from cupy.cuda import nccl
    uid = nccl.get_unique_id()       # on one rank; share it with the others
    comm = nccl.NcclCommunicator(nranks, uid, rank)
    comm.allReduce(x.ctypes.data, y.ctypes.data, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)

Buffers are addresses (ints), as in CuPy: host memory always works; CUDA device
memory (e.g. ``cupy.ndarray.data.ptr``) works when a CUDA runtime can be loaded,
and the collective is then ordered on ``stream`` (an int, or an object with a
``ptr`` attribute such as ``cupy.cuda.Stream``). As a convenience, numpy/cupy
arrays (anything with ``__array_interface__`` / ``__cuda_array_interface__``)
are accepted wherever an address is.

This module is a ctypes layer over ``libharp-nccl.so`` (the same library that
serves C programs through LD_PRELOAD), so both paths share one implementation.
Checks: counts, datatypes, ops, roots and peers must be integers (numpy integers too; bool
and float are refused) that their C types hold (size_t for counts, int for the others, 0 to
2**64-1 for addresses and streams): ctypes would silently wrap any other (2**32 + 7 read as
7), so such a value is refused naming the argument, the value and the range. An array passed
as a buffer must be C-contiguous and hold the bytes the call uses (count x datatype size, x
nranks for allGather's recvbuf and reduceScatter's sendbuf); a bare address carries no size,
so that stays the caller's, as in NCCL. Bad arguments raise NcclInvalidArgument (an
NcclError with NCCL_INVALID_ARGUMENT and a harp.InvalidArgumentError), and so do the
library's own refusals (status NCCL_INVALID_ARGUMENT). Lifetime: host-memory calls outside a
group are done when they return; inside a group they run at the outermost groupEnd, and
arrays passed to them are kept alive until then; device-memory calls are ordered on the
stream, and the arrays must live until the stream passes them, as in NCCL.

Threading: as NCCL — one thread per communicator at a time; ctypes releases the
GIL during every call, so several threads may drive several communicators.
"""
from __future__ import annotations

import ctypes
import numbers
import os
import threading

from .._types import COLL_TRAITS, NCCL_ITEMSIZE, Coll, buffer_elems
from ..errors import InvalidArgumentError

NCCL_UNIQUE_ID_BYTES = 128

# NCCL's enum values (public ABI), mirrored from base/vocab.def and checked against it at build
# time (scripts/check_vocab.py).
# ncclResult_t
NCCL_SUCCESS = 0
NCCL_UNHANDLED_CUDA_ERROR = 1
NCCL_SYSTEM_ERROR = 2
NCCL_INTERNAL_ERROR = 3
NCCL_INVALID_ARGUMENT = 4
NCCL_INVALID_USAGE = 5
NCCL_REMOTE_ERROR = 6
NCCL_IN_PROGRESS = 7

# ncclRedOp_t
NCCL_SUM = 0
NCCL_PROD = 1
NCCL_MAX = 2
NCCL_MIN = 3
NCCL_AVG = 4

# ncclDataType_t
NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9

NCCL_SPLIT_NOCOLOR = -1
# ncclScalarResidence_t
NCCL_SCALAR_DEVICE = 0
NCCL_SCALAR_HOST_IMMEDIATE = 1

_ERROR_NAMES = {
    0: "NCCL_ERROR_SUCCESS",
    1: "NCCL_ERROR_UNHANDLED_CUDA_ERROR",
    2: "NCCL_ERROR_SYSTEM_ERROR",
    3: "NCCL_ERROR_INTERNAL_ERROR",
    4: "NCCL_ERROR_INVALID_ARGUMENT",
    5: "NCCL_ERROR_INVALID_USAGE",
    6: "NCCL_ERROR_REMOTE_ERROR",
    7: "NCCL_ERROR_IN_PROGRESS",
}

available = True


# ncclCommShrink / ncclCommRevoke flags (nccl.h 2.27-2.29)
NCCL_SHRINK_DEFAULT, NCCL_SHRINK_ABORT, NCCL_REVOKE_DEFAULT = 0x00, 0x01, 0x00


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


def library_path() -> str:
    """Path of libharp-nccl.so, beside libharp.so in the harp package (HARP_NCCL_LIB overrides)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.environ.get("HARP_NCCL_LIB") or os.path.join(package, "libharp-nccl.so")


_lib = None


def _cudart_hint():
    """Point libharp-nccl.so at a pip-installed CUDA runtime (nvidia-cuda-runtime-cu12 or the
    CUDA 13 nvidia-cuda-runtime, as torch and cupy wheels bring) when the system has none on its library path."""
    if os.environ.get("HARP_CUDART"):
        return
    import ctypes.util
    import glob
    import sys

    if ctypes.util.find_library("cudart"):
        return
    for d in sys.path:
        # CUDA 12 wheels: nvidia/cuda_runtime/lib; CUDA 13 wheels (torch +cu130): nvidia/cu13/lib
        hits = sorted(glob.glob(os.path.join(d or ".", "nvidia", "cuda_runtime", "lib", "libcudart.so.*")) +
                      glob.glob(os.path.join(d or ".", "nvidia", "cu13", "lib", "libcudart.so.*")))
        if hits:
            os.environ["HARP_CUDART"] = hits[0]
            return


def _L():
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        raise ImportError(f"harp.nccl: {path} does not exist (this HARP build has no NCCL library)")
    _cudart_hint()
    lib = ctypes.CDLL(path)
    P, I, S, VP = ctypes.POINTER, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
    sig = {
        "ncclGetVersion": [P(I)],
        "ncclGetUniqueId": [P(_UniqueId)],
        "ncclCommInitRank": [P(VP), I, _UniqueId, I],
        "ncclCommInitAll": [P(VP), I, P(I)],
        "ncclCommSplit": [VP, I, I, P(VP), VP],
        "ncclCommFinalize": [VP],
        "ncclCommDestroy": [VP],
        "ncclCommAbort": [VP],
        "ncclCommGetAsyncError": [VP, P(I)],
        "ncclCommCount": [VP, P(I)],
        "ncclCommCuDevice": [VP, P(I)],
        "ncclCommUserRank": [VP, P(I)],
        "ncclCommRegister": [VP, VP, S, P(VP)],
        "ncclCommDeregister": [VP, VP],
        "ncclMemAlloc": [P(VP), S],
        "ncclMemFree": [VP],
        "ncclRedOpCreatePreMulSum": [P(I), VP, I, I, VP],
        "ncclRedOpDestroy": [I, VP],
        "ncclAllReduce": [VP, VP, S, I, I, VP, VP],
        "ncclReduce": [VP, VP, S, I, I, I, VP, VP],
        "ncclBroadcast": [VP, VP, S, I, I, VP, VP],
        "ncclBcast": [VP, S, I, I, VP, VP],
        "ncclReduceScatter": [VP, VP, S, I, I, VP, VP],
        "ncclAllGather": [VP, VP, S, I, VP, VP],
        "ncclSend": [VP, S, I, I, VP, VP],
        "ncclRecv": [VP, S, I, I, VP, VP],
        "ncclGroupStart": [],
        "ncclGroupEnd": [],
        # fault tolerance (NCCL 2.27-2.29)
        "ncclCommRevoke": [VP, I],
        "ncclCommShrink": [VP, P(I), I, P(VP), VP, I],
        "ncclCommGetUniqueId": [VP, P(_UniqueId)],
        "ncclCommGrow": [VP, I, P(_UniqueId), I, P(VP), VP],
    }
    for name, args in sig.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = I
    for name in ("ncclGetErrorString",):
        getattr(lib, name).argtypes = [I]
        getattr(lib, name).restype = ctypes.c_char_p
    lib.ncclGetLastError.argtypes = [VP]
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.harpNcclCallsServed.argtypes = []
    lib.harpNcclCallsServed.restype = ctypes.c_ulonglong
    _lib = lib
    return lib


class NcclError(RuntimeError):
    """An NCCL call failed. ``status`` is the ncclResult_t; the message carries
    NCCL's error string and HARP's detailed text (ncclGetLastError)."""

    def __init__(self, status: int, detail: str = ""):
        self.status = status
        self.detail = detail
        msg = _L().ncclGetErrorString(status).decode()
        text = f"{_ERROR_NAMES.get(status, 'NCCL_ERROR_' + str(status))}: {msg}"
        super().__init__(text + (f" ({detail})" if detail else ""))

    def __reduce__(self):
        return (type(self), (self.status, self.detail))


def _check(status: int, comm=None):
    if status != NCCL_SUCCESS:
        detail = _L().ncclGetLastError(comm)
        detail = detail.decode(errors="replace") if detail else ""
        if status == NCCL_INVALID_ARGUMENT:  # the library refused an argument: a harp InvalidArgumentError too
            raise NcclInvalidArgument(detail)
        raise NcclError(status, detail)


class NcclInvalidArgument(NcclError, InvalidArgumentError):
    """A bad argument found by harp.nccl before calling the library (status NCCL_INVALID_ARGUMENT):
    both an NcclError, as CuPy code expects, and a harp InvalidArgumentError (a ValueError)."""

    def __init__(self, detail: str):
        NcclError.__init__(self, NCCL_INVALID_ARGUMENT, detail)

    def __reduce__(self):
        return (type(self), (self.detail,))


# The C type behind each integer argument: ctypes would silently wrap a value outside it
# (c_int(2**32 + 7) is 7: another datatype, root or peer), so every one is checked first.
INT = (-2**31, 2**31 - 1, "int")
SIZE = (0, 2**64 - 1, "size_t")
ADDR = (0, 2**64 - 1, "an address")


def _int(x, what: str, ctype=INT) -> int:
    """An integer argument (numpy integers too), never bool or float, within its C type."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise NcclInvalidArgument(f"{what} must be an integer, got {type(x).__name__} {x!r}")
    lo, hi, name = ctype
    if not lo <= x <= hi:
        raise NcclInvalidArgument(f"{what} {int(x)} is out of range [{lo}, {hi}] ({name})")
    return int(x)


def _count(x, what: str = "count") -> int:
    return _int(x, what, SIZE)


def _array_bytes(iface, what: str) -> int:
    """Bytes of a C-contiguous array from its (CUDA) array interface; refuses strided arrays."""
    shape = tuple(int(s) for s in iface["shape"])
    itemsize = int(iface["typestr"][2:])
    strides = iface.get("strides")
    if strides is not None:
        expect, step = [], itemsize
        for s in reversed(shape):
            expect.append(step)
            step *= s
        if any(a != b and s > 1 for a, b, s in zip(strides, reversed(expect), shape)):
            raise NcclInvalidArgument(f"{what}: array is not C-contiguous (the call reads it as one block)")
    n = itemsize
    for s in shape:
        n *= s
    return n


def _ptr(x, what: str = "buffer", nbytes: int | None = None, keep: bool = False) -> int:
    """An address from an int, a cupy/numpy array or memory pointer. For an array, also checks that
    it holds `nbytes` (count x itemsize, as the call will read or write), and inside a group keeps
    it alive until the outermost groupEnd. A bare address carries no size: that stays the caller's,
    as in NCCL."""
    if x is None:
        return 0
    if isinstance(x, bool):
        raise NcclInvalidArgument(f"{what}: {x!r} is not a buffer")
    if isinstance(x, numbers.Integral):
        return _int(x, what, ADDR)
    iface = getattr(x, "__cuda_array_interface__", None)
    if iface is None:
        iface = getattr(x, "__array_interface__", None)
    if iface is not None:
        if nbytes is not None:
            have = _array_bytes(iface, what)
            if have < nbytes:
                raise NcclInvalidArgument(f"{what}: the call needs {nbytes} bytes (count x datatype size), "
                                          f"the array has {have}")
        addr = int(iface["data"][0])
    elif hasattr(x, "ptr"):
        addr = int(x.ptr)
    else:
        raise TypeError(
            f"harp.nccl: cannot take the address of {type(x).__name__} (pass an int, an array, or .data.ptr)")
    if getattr(_group, "depth", 0) > 0:
        _group.keep.append(x)  # runs at groupEnd: the array must live until then
    return addr


def _stream(s) -> int:
    if s is None:
        return 0
    if isinstance(s, numbers.Integral):
        return _int(s, "stream", ADDR)
    if hasattr(s, "ptr"):
        return _int(s.ptr, "stream.ptr", ADDR)
    raise TypeError(f"harp.nccl: stream must be an int or have .ptr, got {type(s).__name__}")


def get_build_version() -> int:
    return 22105


def get_version() -> int:
    v = ctypes.c_int()
    _check(_L().ncclGetVersion(ctypes.byref(v)))
    return v.value


def get_unique_id() -> tuple:
    """128 signed bytes, as CuPy returns them. Starts HARP's rendezvous service
    in this process: call it on one rank only and keep that process alive."""
    uid = _UniqueId()
    _check(_L().ncclGetUniqueId(ctypes.byref(uid)))
    raw = ctypes.string_at(ctypes.addressof(uid), NCCL_UNIQUE_ID_BYTES)
    return tuple(b - 256 if b > 127 else b for b in raw)


def _to_uid(comm_id) -> _UniqueId:
    if isinstance(comm_id, (bytes, bytearray)):
        raw = bytes(comm_id)
    else:  # CuPy's tuple of signed bytes (unsigned ones accepted too)
        raw = bytes(_int(b, f"commId[{i}]", (-128, 255, "a byte")) % 256 for i, b in enumerate(comm_id))
    if len(raw) != NCCL_UNIQUE_ID_BYTES:
        raise NcclInvalidArgument(f"commId: a unique id has {NCCL_UNIQUE_ID_BYTES} bytes, got {len(raw)}")
    uid = _UniqueId()
    ctypes.memmove(ctypes.addressof(uid), raw, NCCL_UNIQUE_ID_BYTES)
    return uid


# Python objects passed to calls inside a group (per thread): host-memory calls in a group run at
# the outermost groupEnd, so their arrays are kept until it returns.
_group = threading.local()


def groupStart():
    _check(_L().ncclGroupStart())
    if getattr(_group, "depth", 0) == 0:
        _group.keep = []
    _group.depth = getattr(_group, "depth", 0) + 1


def groupEnd():
    try:
        _check(_L().ncclGroupEnd())
    finally:
        d = getattr(_group, "depth", 0)
        if d > 0:
            _group.depth = d - 1
            if d == 1:
                _group.keep = []


def get_last_error() -> str:
    """HARP extension: ncclGetLastError(NULL) for this thread."""
    t = _L().ncclGetLastError(None)
    return t.decode(errors="replace") if t else ""


def calls_served() -> int:
    """HARP extension: NCCL calls served by libharp-nccl.so in this process."""
    return int(_L().harpNcclCallsServed())


def mem_alloc(size: int) -> int:
    """ncclMemAlloc: device memory when CUDA is usable, else aligned host memory."""
    p = ctypes.c_void_p()
    _check(_L().ncclMemAlloc(ctypes.byref(p), _count(size, "mem_alloc: size")))
    return p.value or 0


def mem_free(ptr: int):
    _check(_L().ncclMemFree(_ptr(ptr, "mem_free: ptr")))


class NcclCommunicator:
    """One rank of an NCCL communicator (``ncclCommInitRank``).

    Args:
        ndev: number of ranks.
        commId: the tuple from :func:`get_unique_id` (bytes also accepted).
        rank: this rank, 0 <= rank < ndev.
    """

    def __init__(self, ndev: int, commId, rank: int):
        self._comm = None
        c = ctypes.c_void_p()
        _check(_L().ncclCommInitRank(ctypes.byref(c), _int(ndev, "NcclCommunicator: nranks (ndev)"), _to_uid(commId),
                                     _int(rank, "NcclCommunicator: rank")))
        self._comm = c.value

    @classmethod
    def _wrap(cls, handle: int) -> "NcclCommunicator":
        obj = cls.__new__(cls)
        obj._comm = handle
        return obj

    @staticmethod
    def initAll(devices):
        """Several ranks in this process (``ncclCommInitAll``): an int (count) or a list of device ids."""
        if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
            ndev, devlist = _int(devices, "initAll: devices", (1, 2**31 - 1, "a number of ranks")), None
        elif isinstance(devices, (list, tuple)):
            ndev = len(devices)
            devlist = [_int(d, f"initAll: devices[{i}]") for i, d in enumerate(devices)]
        else:
            raise NcclInvalidArgument('initAll: "devices" should be an int or a list of int.')
        arr = (ctypes.c_void_p * ndev)()
        dl = (ctypes.c_int * ndev)(*devlist) if devlist is not None else None
        _check(_L().ncclCommInitAll(arr, ndev, dl))
        return [NcclCommunicator._wrap(arr[i]) for i in range(ndev)]

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    @property
    def comm(self) -> int:
        return self._comm or 0

    def _c(self):
        if not self._comm:
            raise NcclError(NCCL_INVALID_USAGE, "communicator has been destroyed or aborted")
        return self._comm

    def destroy(self):
        if self._comm:
            c, self._comm = self._comm, None
            _check(_L().ncclCommDestroy(c))

    def abort(self):
        if self._comm:
            c, self._comm = self._comm, None
            _check(_L().ncclCommAbort(c))

    def finalize(self):
        _check(_L().ncclCommFinalize(self._c()), self._comm)

    def split(self, color: int, key: int):
        """ncclCommSplit; None for NCCL_SPLIT_NOCOLOR."""
        out = ctypes.c_void_p()
        _check(_L().ncclCommSplit(self._c(), _int(color, "split: color"), _int(key, "split: key"), ctypes.byref(out),
                                  None), self._comm)
        return NcclCommunicator._wrap(out.value) if out.value else None

    # -- fault tolerance (NCCL 2.27-2.29 semantics, bindings/nccl/nccl_ft.cc) --
    def revoke(self, flags: int = NCCL_REVOKE_DEFAULT):
        """ncclCommRevoke: every pending and later operation on every rank fails (ncclRemoteError)."""
        _check(_L().ncclCommRevoke(self._c(), _int(flags, "revoke: flags")), self._comm)

    def shrink(self, exclude, flags: int = NCCL_SHRINK_DEFAULT) -> "NcclCommunicator":
        """ncclCommShrink: the communicator of the ranks not in ``exclude`` (only they call it)."""
        ex = [_int(r, f"shrink: exclude[{i}]") for i, r in enumerate(exclude)]
        flags = _int(flags, "shrink: flags")
        arr = (ctypes.c_int * max(1, len(ex)))(*ex)
        out = ctypes.c_void_p()
        _check(_L().ncclCommShrink(self._c(), arr, len(ex), ctypes.byref(out), None, flags), self._comm)
        return NcclCommunicator._wrap(out.value)

    def get_unique_id(self) -> tuple:
        """ncclCommGetUniqueId: a fresh id for ncclCommGrow (served by this process)."""
        uid = _UniqueId()
        _check(_L().ncclCommGetUniqueId(self._c(), ctypes.byref(uid)), self._comm)
        raw = ctypes.string_at(ctypes.addressof(uid), NCCL_UNIQUE_ID_BYTES)
        return tuple(b - 256 if b > 127 else b for b in raw)

    def grow(self, nranks: int, commId=None) -> "NcclCommunicator":
        """ncclCommGrow on an existing rank (rank 0 passes the id from get_unique_id())."""
        out = ctypes.c_void_p()
        uid = None if commId is None else ctypes.byref(_to_uid(commId))
        _check(_L().ncclCommGrow(self._c(), _int(nranks, "grow: nranks"), uid, -1, ctypes.byref(out), None),
               self._comm)
        return NcclCommunicator._wrap(out.value)

    @staticmethod
    def join(nranks: int, commId, rank: int) -> "NcclCommunicator":
        """ncclCommGrow on a joining rank (comm NULL)."""
        out = ctypes.c_void_p()
        _check(_L().ncclCommGrow(None, _int(nranks, "join: nranks"), ctypes.byref(_to_uid(commId)),
                                 _int(rank, "join: rank"), ctypes.byref(out), None))
        return NcclCommunicator._wrap(out.value)

    def _int_query(self, fn) -> int:
        v = ctypes.c_int()
        _check(fn(self._c(), ctypes.byref(v)), self._comm)
        return v.value

    def device_id(self) -> int:
        return self._int_query(_L().ncclCommCuDevice)

    def rank_id(self) -> int:
        return self._int_query(_L().ncclCommUserRank)

    def size(self) -> int:
        return self._int_query(_L().ncclCommCount)

    def check_async_error(self):
        err = ctypes.c_int(0)
        r = _L().ncclCommGetAsyncError(self._c(), ctypes.byref(err))
        _check(err.value, self._comm)
        _check(r, self._comm)

    def get_async_error(self) -> int:
        """HARP extension: the ncclResult_t of ncclCommGetAsyncError (no raise)."""
        err = ctypes.c_int(0)
        _check(_L().ncclCommGetAsyncError(self._c(), ctypes.byref(err)), self._comm)
        return err.value

    # Every call checks its scalar arguments (integers, not bool or float, within their C types:
    # count size_t, datatype/op/root/peer int, buffers and stream addresses) and, for array
    # buffers, that each holds count x itemsize bytes (x nranks where the call says so). Values
    # the C types hold but the call cannot use (root 5 of 2 ranks) are the library's to refuse.
    def _nbytes(self, fn, count, datatype, what="count"):
        """(count, datatype, count x itemsize or None for a datatype the library will refuse)."""
        n, dt = _count(count, f"{fn}: {what}"), _int(datatype, f"{fn}: datatype")
        size = NCCL_ITEMSIZE.get(dt)  # from base/vocab.def
        return n, dt, None if size is None else n * size

    def _bytes(self, coll, nb, root=None):
        """(send, receive) bytes this rank's buffers must hold in a `coll` call of nb bytes a block:
        base/vocab.def's byte rule. None where nothing is checked: the datatype is refused (nb None)
        or this rank uses no such buffer (reduce's receive and broadcast's send off the root)."""
        if nb is None:
            return None, None
        t = COLL_TRAITS[coll]
        p = self._nranks() if "count_p" in t.send + t.recv else 1
        s, r = buffer_elems(coll, nb, p, root is not None and self._is(root))
        return s or None, r or None

    def _nranks(self) -> int:
        n = getattr(self, "_size", None)
        if n is None:
            n = self._size = self.size()
        return n

    def _is(self, root) -> bool:
        r = getattr(self, "_rank", None)
        if r is None:
            r = self._rank = self.rank_id()
        return r == root

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream=0):
        n, dt, nb = self._nbytes("allReduce", count, datatype)
        op, st = _int(op, "allReduce: op"), _stream(stream)
        sb, rb = self._bytes(Coll.allreduce, nb)
        _check(_L().ncclAllReduce(_ptr(sendbuf, "allReduce: sendbuf", sb), _ptr(recvbuf, "allReduce: recvbuf", rb),
                                  n, dt, op, self._c(), st), self._comm)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream=0):
        n, dt, nb = self._nbytes("reduce", count, datatype)
        op, root, st = _int(op, "reduce: op"), _int(root, "reduce: root"), _stream(stream)
        sb, rb = self._bytes(Coll.reduce, nb, root)
        _check(_L().ncclReduce(_ptr(sendbuf, "reduce: sendbuf", sb), _ptr(recvbuf, "reduce: recvbuf", rb), n, dt, op,
                               root, self._c(), st), self._comm)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream=0):
        n, dt, nb = self._nbytes("broadcast", count, datatype)
        root, st = _int(root, "broadcast: root"), _stream(stream)
        sb, rb = self._bytes(Coll.broadcast, nb, root)
        _check(_L().ncclBroadcast(_ptr(sendbuff, "broadcast: sendbuff", sb), _ptr(recvbuff, "broadcast: recvbuff", rb),
                                  n, dt, root, self._c(), st), self._comm)

    def bcast(self, buff, count, datatype, root, stream=0):
        n, dt, nb = self._nbytes("bcast", count, datatype)
        root, st = _int(root, "bcast: root"), _stream(stream)
        _check(_L().ncclBcast(_ptr(buff, "bcast: buff", nb), n, dt, root, self._c(), st), self._comm)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream=0):
        n, dt, nb = self._nbytes("reduceScatter", recvcount, datatype, "recvcount")
        op, st = _int(op, "reduceScatter: op"), _stream(stream)
        sb, rb = self._bytes(Coll.reduce_scatter, nb)
        _check(_L().ncclReduceScatter(_ptr(sendbuf, "reduceScatter: sendbuf", sb),
                                      _ptr(recvbuf, "reduceScatter: recvbuf", rb), n, dt, op, self._c(), st),
               self._comm)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream=0):
        n, dt, nb = self._nbytes("allGather", count, datatype)
        st = _stream(stream)
        sb, rb = self._bytes(Coll.allgather, nb)
        _check(_L().ncclAllGather(_ptr(sendbuf, "allGather: sendbuf", sb), _ptr(recvbuf, "allGather: recvbuf", rb),
                                  n, dt, self._c(), st), self._comm)

    def send(self, sendbuf, count, datatype, peer, stream=0):
        n, dt, nb = self._nbytes("send", count, datatype)
        peer, st = _int(peer, "send: peer"), _stream(stream)
        _check(_L().ncclSend(_ptr(sendbuf, "send: sendbuf", self._bytes(Coll.send, nb)[0]), n, dt, peer, self._c(),
                             st), self._comm)

    def recv(self, recvbuf, count, datatype, peer, stream=0):
        n, dt, nb = self._nbytes("recv", count, datatype)
        peer, st = _int(peer, "recv: peer"), _stream(stream)
        _check(_L().ncclRecv(_ptr(recvbuf, "recv: recvbuf", self._bytes(Coll.recv, nb)[1]), n, dt, peer, self._c(),
                             st), self._comm)

    # HARP extensions (NCCL C API functions CuPy does not wrap).
    def create_premul_sum(self, scalar, datatype, residence=NCCL_SCALAR_HOST_IMMEDIATE) -> int:
        """ncclRedOpCreatePreMulSum; `scalar` is an address (or array) holding one element of `datatype`."""
        op = ctypes.c_int()
        dt, res = _int(datatype, "create_premul_sum: datatype"), _int(residence, "create_premul_sum: residence")
        _check(_L().ncclRedOpCreatePreMulSum(ctypes.byref(op), _ptr(scalar, "create_premul_sum: scalar"), dt, res,
                                             self._c()), self._comm)
        return op.value

    def destroy_op(self, op: int):
        _check(_L().ncclRedOpDestroy(_int(op, "destroy_op: op"), self._c()), self._comm)

    def register(self, buf, nbytes: int) -> int:
        h = ctypes.c_void_p()
        nbytes = _count(nbytes, "register: nbytes")
        _check(_L().ncclCommRegister(self._c(), _ptr(buf, "register: buf"), nbytes, ctypes.byref(h)), self._comm)
        return h.value

    def deregister(self, handle: int):
        _check(_L().ncclCommDeregister(self._c(), _ptr(handle, "deregister: handle")), self._comm)


__all__ = [n for n in dir() if n.startswith("NCCL_")] + [
    "NcclCommunicator", "NcclError", "NcclInvalidArgument", "get_unique_id", "get_version", "get_build_version", "groupStart", "groupEnd",
    "available", "get_last_error", "calls_served", "mem_alloc", "mem_free", "library_path",
]
