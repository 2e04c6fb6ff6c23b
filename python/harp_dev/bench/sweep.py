"""What every harp-bench worker shares: the size sweep, nccl-tests' bus-bandwidth
factors, data initialisation and checking, and the output format.

A worker (HARP, gloo or MPI) measures each size and returns rows of
``{"size", "count", "oop_us", "ip_us", "oop_wrong", "ip_wrong"}`` (HARP adds the
"transport" and "algo" that carried each size); the CLI prints them in nccl-tests'
columns, plus transport and algorithm, and, with --compare, side by side.
"""
from __future__ import annotations

import numpy as np
from harp._types import Coll, buffer_elems
from harp.metrics import bus_factor  # nccl-tests' factor, declared once there

# nccl-tests type names -> numpy dtype names
TYPES = {
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64",
    "half": "float16", "float16": "float16", "float": "float32", "float32": "float32", "double": "float64",
    "float64": "float64", "bfloat16": "bfloat16",
}
NCCL_TYPE_NAME = {"float16": "half", "float32": "float", "float64": "double"}
COLLECTIVES = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"]


def numpy_dtype(name):
    n = TYPES.get(name)
    if n is None:
        raise SystemExit(f"harp-bench: unknown datatype '{name}' (known: {', '.join(TYPES)})")
    if n == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(n)


def sizes(minbytes, maxbytes, factor, step):
    out, s = [], minbytes
    while s <= maxbytes:
        out.append(s)
        s = s + step if step else int(s * factor)
        if factor <= 1 and not step:
            break
    return out


def counts(coll, size_bytes, esize, n):
    """(send elements, recv elements, nccl-tests 'count') for a sweep size, as nccl-tests defines it:
    size is the largest buffer (allgather: output, reduce_scatter: input). The buffers relate as
    HARP's byte rule says (base/vocab.def, harp._types.buffer_elems, the root's view)."""
    total = size_bytes // esize
    ks, kr = buffer_elems(Coll[coll], 1, n)
    per = total // max(ks, kr)
    ns, nr = per * ks, per * kr
    return ns, nr, ns if coll == "alltoall" else per  # nccl-tests' alltoall count is the whole buffer


def parse_size(s):
    s = str(s).strip()
    mult = 1
    if s[-1:] in "kKmMgG":
        mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[s[-1].lower()]
        s = s[:-1]
    return int(float(s) * mult)


def fill_values(lo, hi, rank, dtype, seed=0):
    """Elements lo..hi-1 of what fill() puts in a buffer of `dtype` on `rank` (so a checker can
    regenerate any slice of any rank's input without holding the whole buffer)."""
    vals = (np.arange(lo, hi, dtype=np.int64) * 7 + rank * 3 + seed) % 5 + 1
    if np.dtype(dtype) == np.bool_:
        return (vals % 2).astype(bool)
    return vals.astype(dtype)


def fill(buf, rank, seed=0):
    """Small integers (exact in every dtype) that differ per rank and element."""
    buf[...] = fill_values(0, buf.size, rank, buf.dtype, seed).reshape(buf.shape)


def header(coll, nranks, dtype_name, op, root, iters, warmup, label="harp"):
    t = NCCL_TYPE_NAME.get(dtype_name, dtype_name)
    lines = [
        f"# {label} {coll}: nranks {nranks}, type {t}, op {op}, root {root}, iters {iters}, warmup {warmup}",
        "#",
        "#                                                              out-of-place                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
        " transport algorithm",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
    ]
    return "\n".join(lines)


def fmt_row(coll, row, nranks, dtype_name, op, root):
    t = NCCL_TYPE_NAME.get(dtype_name, dtype_name)
    f = bus_factor(coll, nranks)

    def cols(us, wrong):
        if us is None:
            return f"{'n/a':>8s} {'':>7s} {'':>7s} {'':>6s}"
        algbw = row["size"] / (us * 1e-6) / 1e9 if us > 0 else 0.0
        w = "N/A" if wrong is None else str(wrong)
        return f"{us:8.2f} {algbw:7.2f} {algbw * f:7.2f} {w:>6s}"

    redop = op if coll in ("allreduce", "reduce", "reduce_scatter") else "none"
    r = root if coll in ("broadcast", "reduce") else -1
    return (f"{row['size']:12d} {row['count']:13d} {t:>9s} {redop:>7s} {r:7d} "
            f"{cols(row.get('oop_us'), row.get('oop_wrong'))} {cols(row.get('ip_us'), row.get('ip_wrong'))}"
            f" {row.get('transport', '-'):>9s} {row.get('algo', '-')}")


def busbw(coll, row, nranks, key):
    us = row.get(key)
    if not us:
        return None
    return row["size"] / (us * 1e-6) / 1e9 * bus_factor(coll, nranks)
