"""harp._statewire — training state between ranks as data only (harp.elastic.State.sync, hvd.elastic).

What a rank receives is parsed, never unpickled: bytes off the wire (which carry no MAC) cannot run
code. A payload is

    b"HARPST1\\n" | header length (u64, little-endian) | header (UTF-8 JSON) | raw buffers

The header is one node, a JSON list [tag, ...]; buffers follow in the order their nodes appear:

    ["n"] None         ["b", true] bool      ["i", 12] int        ["f", 0.5] float (NaN, Infinity too)
    ["s", "x"] str     ["y", n] bytes (n buffer bytes)
    ["l", [node...]] list     ["t", [node...]] tuple
    ["d", [[key, value]...]] dict     ["o", [[key, value]...]] collections.OrderedDict
    ["a", "<f4", [shape], scalar] numpy array (or numpy scalar): bool, int, uint, float, complex only
    ["T", "float32", [shape], requires_grad, is_parameter, "cpu"] torch tensor (made on the CPU, moved
        to the device it came from)

Dict keys are None, bool, int, float, str, bytes or tuples of those. Anything else is refused by
name where it is encoded (InvalidArgumentError, naming the path, e.g. state['opt'][3]) and any
payload that breaks these rules where it is decoded (InvalidArgumentError: not a HARP state payload
/ malformed HARP state payload: what). Nesting is limited to 64 levels.
"""
from __future__ import annotations

import collections
import json
import math
import re
import struct

import numpy as np

from .errors import InvalidArgumentError

MAGIC = b"HARPST1\n"
MAX_DEPTH = 64
_NP_DTYPE = re.compile(r"^[<>|][biufc](1|2|4|8|16)$")
_TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
                 "complex64", "complex128")
_KEY_TYPES = (type(None), bool, int, float, str, bytes, tuple)
_SUPPORTED = ("None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays and scalars "
              "(bool/int/uint/float/complex) and torch tensors")


def _is_torch_tensor(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "untyped_storage")


def encode(obj, name="state") -> bytes:
    """The payload of `obj`; InvalidArgumentError naming the first value that is not data."""
    bufs = []

    def enc(x, path, depth):
        if depth > MAX_DEPTH:
            raise InvalidArgumentError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        if x is None:
            return ["n"]
        if isinstance(x, bool):
            return ["b", x]
        if isinstance(x, int):  # and IntEnum, IntFlag (sent as plain ints)
            return ["i", int(x)]
        if isinstance(x, float) and not isinstance(x, np.generic):
            return ["f", float(x)]
        if isinstance(x, str):
            return ["s", str.__str__(x)]
        if isinstance(x, (bytes, bytearray)):
            bufs.append(bytes(x))
            return ["y", len(x)]
        if isinstance(x, (list, tuple)):  # a namedtuple goes as a tuple
            return ["t" if isinstance(x, tuple) else "l", [enc(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]]
        if isinstance(x, dict):  # an OrderedDict stays one; other dict types go as dicts
            items = []
            for k, v in x.items():
                if not isinstance(k, _KEY_TYPES):
                    raise InvalidArgumentError(f"{path}: a key is a {type(k).__name__}; keys are None, bool, int, "
                                               "float, str, bytes or tuples")
                items.append([enc(k, f"{path} key {k!r}", depth + 1), enc(v, f"{path}[{k!r}]", depth + 1)])
            return ["o" if isinstance(x, collections.OrderedDict) else "d", items]
        if isinstance(x, (np.ndarray, np.generic)) and type(x) is not np.matrix:
            a = np.asarray(x)
            if not _NP_DTYPE.match(a.dtype.str):
                raise InvalidArgumentError(f"{path}: a numpy {a.dtype} array; only bool, int, uint, float and "
                                           "complex arrays are sent")
            bufs.append(np.ascontiguousarray(a).tobytes())
            return ["a", a.dtype.str, list(a.shape), isinstance(x, np.generic)]
        if _is_torch_tensor(x):
            import torch

            name_ = str(x.dtype).replace("torch.", "")
            if name_ not in _TORCH_DTYPES or x.is_sparse or x.is_quantized:
                raise InvalidArgumentError(f"{path}: a torch {x.dtype} tensor (layout {x.layout}); only dense "
                                           f"tensors of {', '.join(_TORCH_DTYPES)} are sent")
            t = x.detach().to("cpu").contiguous()
            bufs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            return ["T", name_, list(t.shape), bool(x.requires_grad), isinstance(x, torch.nn.Parameter),
                    str(x.device)]
        raise InvalidArgumentError(f"{path} is a {type(x).__module__}.{type(x).__qualname__}; the state sent "
                                   f"between ranks holds only {_SUPPORTED}")

    header = json.dumps(enc(obj, name, 0), separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<Q", len(header)), header] + bufs)


def _bad(what):
    return InvalidArgumentError(f"malformed HARP state payload: {what}")


def decode(data) -> object:
    """The object a payload holds; InvalidArgumentError when the bytes are not such a payload."""
    data = memoryview(data).cast("B")
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise InvalidArgumentError(f"not a HARP state payload (starts {bytes(data[:8])!r}, not {MAGIC!r}): "
                                   "refused (nothing received is unpickled)")
    if len(data) < len(MAGIC) + 8:
        raise _bad("truncated header length")
    (hlen,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    if hlen > len(data) - start:
        raise _bad(f"header of {hlen} bytes in a payload of {len(data)}")
    try:
        tree = json.loads(bytes(data[start:start + hlen]).decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(f"header is not JSON ({type(e).__name__})") from None
    pos = [start + hlen]

    def take(n):
        if n < 0 or n > len(data) - pos[0]:
            raise _bad(f"a buffer of {n} bytes where {len(data) - pos[0]} are left")
        b = data[pos[0]:pos[0] + n]
        pos[0] += n
        return b

    def shape_of(s):
        if not isinstance(s, list) or len(s) > 64 or not all(type(d) is int and d >= 0 for d in s):
            raise _bad(f"shape {s!r}")
        return tuple(s), math.prod(s)

    def dec(node, depth):
        if depth > MAX_DEPTH:
            raise _bad(f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise _bad(f"node {str(node)[:40]!r}")
        tag, args = node[0], node[1:]

        def want(n, *types):
            if len(args) != n or not all(isinstance(a, t) and (t is bool or not isinstance(a, bool))
                                         for a, t in zip(args, types)):
                raise _bad(f"a {tag!r} node {str(node)[:60]}")

        if tag == "n":
            want(0)
            return None
        if tag == "b":
            want(1, bool)
            return args[0]
        if tag == "i":
            want(1, int)
            return args[0]
        if tag == "f":
            want(1, (int, float))
            return float(args[0])
        if tag == "s":
            want(1, str)
            return args[0]
        if tag == "y":
            want(1, int)
            return bytes(take(args[0]))
        if tag in ("l", "t"):
            want(1, list)
            vals = [dec(v, depth + 1) for v in args[0]]
            return vals if tag == "l" else tuple(vals)
        if tag in ("d", "o"):
            want(1, list)
            out = {} if tag == "d" else collections.OrderedDict()
            for kv in args[0]:
                if not isinstance(kv, list) or len(kv) != 2:
                    raise _bad("a dict item that is not [key, value]")
                k = dec(kv[0], depth + 1)
                if not isinstance(k, _KEY_TYPES) or (isinstance(k, tuple) and not _hashable(k)):
                    raise _bad(f"a dict key of type {type(k).__name__}")
                out[k] = dec(kv[1], depth + 1)
            return out
        if tag == "a":
            want(3, str, list, bool)
            if not _NP_DTYPE.match(args[0]):
                raise _bad(f"numpy dtype {args[0][:20]!r}")
            dt = np.dtype(args[0])
            shape, n = shape_of(args[1])
            a = np.frombuffer(take(n * dt.itemsize), dt).reshape(shape).copy()
            if args[2]:
                if shape:
                    raise _bad("a numpy scalar with a shape")
                return a[()]
            return a
        if tag == "T":
            want(5, str, list, bool, bool, str)
            if args[0] not in _TORCH_DTYPES:
                raise _bad(f"torch dtype {args[0][:20]!r}")
            import torch

            dt = getattr(torch, args[0])
            shape, n = shape_of(args[1])
            raw = take(n * torch.empty((), dtype=dt).element_size())
            t = (torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape).clone() if n
                 else torch.empty(shape, dtype=dt))
            try:
                dev = torch.device(args[4])
                if dev.type != "cpu":
                    t = t.to(dev)
            except (RuntimeError, ValueError) as e:
                raise _bad(f"tensor device {args[4][:40]!r}: {e}") from None
            if args[2] and (t.is_floating_point() or t.is_complex()):
                t.requires_grad_(True)
            return torch.nn.Parameter(t, requires_grad=args[2]) if args[3] else t
        raise _bad(f"unknown tag {tag[:10]!r}")

    try:
        obj = dec(tree, 0)
    except RecursionError:
        raise _bad("nested too deep") from None
    if pos[0] != len(data):
        raise _bad(f"{len(data) - pos[0]} bytes after the last buffer")
    return obj


def _hashable(k):
    try:
        hash(k)
        return True
    except TypeError:
        return False


def broadcast(comm, obj, root: int = 0, who: str = "harp state"):
    """Collective: every rank gets rank `root`'s `obj` (root keeps its own). Two broadcasts (length, bytes),
    as data (encode/decode). A value root cannot send raises on every rank, naming it on root."""
    if comm.rank == root:
        try:
            blob, err = encode(obj, who), None
        except InvalidArgumentError as e:
            blob, err = b"", e
        comm.broadcast(np.array([-1 if err else len(blob)], np.int64), root=root)
        if err:
            raise err
        comm.broadcast(np.frombuffer(blob, np.uint8).copy(), root=root)
        return obj
    n = np.zeros(1, np.int64)
    comm.broadcast(n, root=root)
    if n[0] < 0:
        raise InvalidArgumentError(f"{who}: rank {root} could not send its state (its error names the value)")
    buf = np.empty(int(n[0]), np.uint8)
    comm.broadcast(buf, root=root)
    return decode(buf)
