"""Device-pointer checks for harp.nccl / libharp-nccl.so (needs a CUDA GPU).

    python tests/nccl/device_check.py [--ranks N] [--part all|core|cupy]

Run by scripts/gpu-check.sh (and gpu-check-nccl.sh) on a GPU machine and by tests/test_nccl.py
when a GPU is present. Needs only a CUDA runtime library (libcudart.so.12 from
the system, HARP_CUDART, or a pip-installed nvidia-cuda-runtime/torch); cupy is
used for an extra check when installed. Ranks are spawned processes (CUDA does
not survive fork) that all use device 0 (or LOCAL_RANK % device count).

Checks, each against values computed on the host:
  1. every collective with cudaMalloc'ed buffers on a non-default stream,
     in place and not (allgather/reduce_scatter in place per NCCL's rules);
  2. stream order: a host function that sleeps 0.5 s, then a copy that fills
     the input, are queued on the stream before the allreduce; the result must
     reflect the filled input, and the ncclAllReduce call itself must return
     at once (the caller is never blocked on the device path);
  3. grouped send/recv (alltoall) between device buffers;
  4. PreMulSum with a scalar in device memory (ncclScalarDevice);
  5. ncclMemAlloc returns device memory; mixed host send / device receive;
  6. ncclCommInitAll: two ranks as threads of one process, device buffers,
     each on its own stream, driven from one thread inside a group;
  7. cupy arrays (when cupy is installed; --part cupy runs this one alone and
     fails when cupy cannot be imported).
Prints one line per check and "ALL DEVICE CHECKS PASSED" at the end
(--part core / --part cupy: "ALL DEVICE CHECKS PASSED (core)" / "(cupy)").
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import multiprocessing as mp
import os
import site
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
if os.path.exists(os.path.join(_SRC, "harp", "libharp-nccl.so")):  # a dev build; else the installed harp
    sys.path.insert(0, _SRC)


def load_nccl():
    """harp.nccl; loaded straight from its file when the harp package cannot be
    imported (e.g. a carried _harp module built for another Python): it needs
    only ctypes and libharp-nccl.so next to it."""
    try:
        from harp import nccl

        return nccl
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location("harp_nccl_standalone", os.path.join(_SRC, "harp", "nccl", "__init__.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


CUDART_NAMES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so", "libcudart.so.11.0")
# Where pip wheels and toolkits put libcudart: CUDA 12 wheels (nvidia/cuda_runtime/lib), CUDA 13 wheels
# (nvidia/cu13/lib), torch's own lib folder, then the toolkit.
CUDART_GLOBS = ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu13/lib/libcudart.so*", "nvidia/cu12/lib/libcudart.so*",
                "torch/lib/libcudart*.so*")
CUDART_SYSTEM = ("/usr/local/cuda/lib64/libcudart.so*", "/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so*",
                 "/usr/lib/x86_64-linux-gnu/libcudart.so*")


def find_cudart() -> str:
    """HARP_CUDART, else a libcudart on the library path, else one from pip wheels or the toolkit."""
    if os.environ.get("HARP_CUDART"):
        return os.environ["HARP_CUDART"]
    for name in CUDART_NAMES:
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            pass
    dirs = site.getsitepackages() + [site.getusersitepackages()] + sys.path
    for d in dirs:
        for pat in CUDART_GLOBS:
            hits = sorted(h for h in glob.glob(os.path.join(d, pat)) if not h.endswith(".a"))
            if hits:
                return hits[-1]
    for pat in CUDART_SYSTEM:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    raise SystemExit("device_check: no libcudart found (set HARP_CUDART=/path/to/libcudart.so.12)")


class Cuda:
    """The few CUDA runtime calls the checks need, through ctypes."""

    H2D, D2H, DEFAULT = 1, 2, 4

    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)
        VP, S, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        for name, args in {
            "cudaSetDevice": [I], "cudaGetDeviceCount": [ctypes.POINTER(I)],
            "cudaMalloc": [ctypes.POINTER(VP), S], "cudaFree": [VP],
            "cudaMemcpy": [VP, VP, S, I], "cudaMemcpyAsync": [VP, VP, S, I, VP],
            "cudaMemset": [VP, I, S], "cudaStreamCreate": [ctypes.POINTER(VP)],
            "cudaStreamSynchronize": [VP], "cudaStreamDestroy": [VP], "cudaDeviceSynchronize": [],
            "cudaLaunchHostFunc": [VP, VP, VP], "cudaHostAlloc": [ctypes.POINTER(VP), S, ctypes.c_uint],
            "cudaPointerGetAttributes": [VP, VP],
        }.items():
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = I

    def ok(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUDA error {rc}")

    def malloc(self, n):
        p = ctypes.c_void_p()
        self.ok(self.lib.cudaMalloc(ctypes.byref(p), n), "cudaMalloc")
        return p.value

    def stream(self):
        s = ctypes.c_void_p()
        self.ok(self.lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        return s.value

    def put(self, dev, arr):
        self.ok(self.lib.cudaMemcpy(dev, arr.ctypes.data, arr.nbytes, self.DEFAULT), "cudaMemcpy H2D")

    def get(self, dev, like):
        out = np.empty_like(like)
        self.ok(self.lib.cudaMemcpy(out.ctypes.data, dev, out.nbytes, self.DEFAULT), "cudaMemcpy D2H")
        return out

    def sync(self, s):
        self.ok(self.lib.cudaStreamSynchronize(s), "cudaStreamSynchronize")

    def mem_type(self, p):
        attr = (ctypes.c_int * 16)()
        self.ok(self.lib.cudaPointerGetAttributes(attr, p), "cudaPointerGetAttributes")
        return attr[0]


def rank_main(rank, size, uid, cudart, q):
    try:
        os.environ["HARP_CUDART"] = cudart
        cu = Cuda(cudart)
        n = ctypes.c_int()
        cu.ok(cu.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        cu.ok(cu.lib.cudaSetDevice(rank % n.value), "cudaSetDevice")
        nccl = load_nccl()

        log = []
        c = nccl.NcclCommunicator(size, uid, rank)
        s = cu.stream()
        N = 1 << 16
        f32 = nccl.NCCL_FLOAT32

        # 1. collectives, device buffers, non-default stream
        x = (np.arange(N, dtype=np.float32) % 97) + rank
        dx, dy = cu.malloc(4 * N), cu.malloc(4 * N * size)
        cu.put(dx, x)
        c.allReduce(dx, dy, N, f32, nccl.NCCL_SUM, s)
        cu.sync(s)
        want = (np.arange(N, dtype=np.float32) % 97) * size + size * (size - 1) / 2
        assert np.array_equal(cu.get(dy, x), want), "allreduce (device, out of place)"
        c.allReduce(dx, dx, N, f32, nccl.NCCL_MAX, s)
        cu.sync(s)
        assert np.array_equal(cu.get(dx, x), (np.arange(N, dtype=np.float32) % 97) + size - 1), "allreduce in place"
        # allgather in place: send = recv + rank*N
        g = np.full(N * size, -1, np.float32)
        g[rank * N:(rank + 1) * N] = rank
        cu.put(dy, g)
        c.allGather(dy + rank * N * 4, dy, N, f32, s)
        cu.sync(s)
        assert np.array_equal(cu.get(dy, g), np.repeat(np.arange(size, dtype=np.float32), N)), "allgather in place"
        # reduce_scatter in place: recv = send + rank*N
        rs = np.arange(N * size, dtype=np.float32) % 1000 + rank
        cu.put(dy, rs)
        c.reduceScatter(dy, dy + rank * N * 4, N, f32, nccl.NCCL_SUM, s)
        cu.sync(s)
        got = cu.get(dy, rs)[rank * N:(rank + 1) * N]
        base = np.arange(N * size, dtype=np.float32) % 1000
        assert np.array_equal(got, base[rank * N:(rank + 1) * N] * size + size * (size - 1) / 2), "reduce_scatter"
        # broadcast, bcast, reduce
        b = np.full(N, rank, np.float32)
        cu.put(dx, b)
        c.broadcast(dx, dy, N, f32, size - 1, s)
        c.bcast(dx, N, f32, 0, s)
        cu.sync(s)
        assert np.all(cu.get(dy, b) == size - 1) and np.all(cu.get(dx, b) == 0), "broadcast/bcast"
        cu.put(dx, np.full(N, rank + 1, np.float32))
        c.reduce(dx, dy, N, f32, nccl.NCCL_PROD, 0, s)
        cu.sync(s)
        if rank == 0:
            assert np.all(cu.get(dy, b) == np.prod(np.arange(1, size + 1))), "reduce prod"
        log.append("collectives on device buffers: ok")

        # 2. stream order and a non-blocking caller
        hostbuf = ctypes.c_void_p()
        cu.ok(cu.lib.cudaHostAlloc(ctypes.byref(hostbuf), 4 * N, 0), "cudaHostAlloc")
        pinned = np.ctypeslib.as_array((ctypes.c_float * N).from_address(hostbuf.value))
        pinned[:] = 5 + rank
        cu.put(dx, np.zeros(N, np.float32))
        SLEEP = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: time.sleep(0.5))
        cu.ok(cu.lib.cudaLaunchHostFunc(s, ctypes.cast(SLEEP, ctypes.c_void_p), None), "cudaLaunchHostFunc")
        cu.ok(cu.lib.cudaMemcpyAsync(dx, hostbuf, 4 * N, Cuda.DEFAULT, s), "cudaMemcpyAsync")
        t = time.monotonic()
        c.allReduce(dx, dy, N, f32, nccl.NCCL_SUM, s)
        call_s = time.monotonic() - t
        cu.sync(s)
        assert np.all(cu.get(dy, b) == sum(5 + r for r in range(size))), "stream order: stale input was reduced"
        assert call_s < 0.25, f"ncclAllReduce on the device path blocked the caller for {call_s:.2f} s"
        log.append(f"stream order kept, caller returned in {call_s * 1000:.1f} ms: ok")

        # 3. grouped send/recv alltoall
        m = 1024
        src = (np.arange(size * m, dtype=np.int64) + rank * 1_000_000)
        ds, dr = cu.malloc(src.nbytes), cu.malloc(src.nbytes)
        cu.put(ds, src)
        nccl.groupStart()
        for p in range(size):
            c.send(ds + p * m * 8, m, nccl.NCCL_INT64, p, s)
            c.recv(dr + p * m * 8, m, nccl.NCCL_INT64, p, s)
        nccl.groupEnd()
        cu.sync(s)
        want = np.concatenate([np.arange(rank * m, (rank + 1) * m) + p * 1_000_000 for p in range(size)])
        assert np.array_equal(cu.get(dr, src), want), "alltoall"
        log.append("grouped send/recv alltoall: ok")

        # 4. PreMulSum with a device scalar
        dsc = cu.malloc(4)
        cu.put(dsc, np.array([0.5], np.float32))
        op = c.create_premul_sum(dsc, f32, nccl.NCCL_SCALAR_DEVICE)
        cu.put(dx, np.full(N, rank + 1, np.float32))
        c.allReduce(dx, dy, N, f32, op, s)
        cu.sync(s)
        assert np.allclose(cu.get(dy, b), 0.5 * size * (size + 1) / 2), "premulsum device scalar"
        c.destroy_op(op)
        log.append("PreMulSum, device scalar: ok")

        # 5. ncclMemAlloc is device memory; host send + device recv
        p = nccl.mem_alloc(4 * N)
        assert cu.mem_type(p) == 2, "ncclMemAlloc did not return device memory"
        hx = np.full(N, rank, np.float32)
        c.allReduce(hx.ctypes.data, p, N, f32, nccl.NCCL_SUM, s)
        cu.sync(s)
        assert np.all(cu.get(p, hx) == size * (size - 1) / 2), "host send, device recv"
        nccl.mem_free(p)
        log.append("ncclMemAlloc device memory, mixed host/device buffers: ok")

        c.destroy()
        q.put((rank, "ok", log))
    except BaseException as e:  # noqa: BLE001
        import traceback

        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def init_all_check(cudart):
    os.environ["HARP_CUDART"] = cudart
    cu = Cuda(cudart)
    cu.ok(cu.lib.cudaSetDevice(0), "cudaSetDevice")
    nccl = load_nccl()

    comms = nccl.NcclCommunicator.initAll([0, 0])
    N = 4096
    streams = [cu.stream() for _ in comms]
    bufs = [cu.malloc(4 * N) for _ in comms]
    for r, b in enumerate(bufs):
        cu.put(b, np.full(N, r + 1, np.float32))
    nccl.groupStart()
    for r, c in enumerate(comms):
        c.allReduce(bufs[r], bufs[r], N, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, streams[r])
    nccl.groupEnd()
    for s in streams:
        cu.sync(s)
    for b in bufs:
        assert np.all(cu.get(b, np.zeros(N, np.float32)) == 3), "initAll group allreduce"
    for c in comms:
        c.destroy()
    return "ncclCommInitAll, 2 ranks as threads, one thread drives both in a group: ok"


def cupy_check(rank, size, uid, q):
    try:
        import cupy as cp

        nccl = load_nccl()

        cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
        c = nccl.NcclCommunicator(size, uid, rank)
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.arange(1000, dtype=cp.float32) + rank
            y = cp.zeros_like(x)
        c.allReduce(x.data.ptr, y.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)
        c.allGather(x, cp.zeros(1000 * size, cp.float32), 1000, nccl.NCCL_FLOAT32, s)  # arrays accepted too
        s.synchronize()
        want = cp.arange(1000, dtype=cp.float32) * size + size * (size - 1) / 2
        assert bool(cp.all(y == want)), "cupy allreduce"
        c.destroy()
        q.put((rank, "ok", ["cupy arrays: ok"]))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, "error", f"{type(e).__name__}: {e}"))


def collect(ps, q, size, timeout):
    """{rank: (status, value)} from the started processes ps through q, until every rank reported,
    all died, or timeout seconds passed; then joins them, killing any still alive. Shared by this
    file, tests/gpu/torch_cuda_check.py and bench/gpu/allreduce_device.py."""
    res, deadline = {}, time.monotonic() + timeout
    while len(res) < size and time.monotonic() < deadline:
        try:
            r, st, val = q.get(timeout=1)
            res[r] = (st, val)
        except Exception:  # noqa: BLE001  (queue.Empty)
            if all(not p.is_alive() for p in ps) and q.empty():
                break
    for p in ps:
        p.join(5)
        if p.is_alive():
            p.kill()
    return res


def run(target, size, *args, timeout=180):
    ctx = mp.get_context("spawn")
    uid = bytes((b + 256) % 256 for b in load_nccl().get_unique_id())
    q = ctx.Queue()
    ps = [ctx.Process(target=target, args=(r, size, uid, *args, q)) for r in range(size)]
    for p in ps:
        p.start()
    res = collect(ps, q, size, timeout)
    if len(res) < size:
        raise SystemExit(f"FAILED: ranks {sorted(set(range(size)) - set(res))} hung or died")
    bad = {r: v for r, (st, v) in res.items() if st != "ok"}
    if bad:
        raise SystemExit("FAILED:\n" + "\n".join(f"rank {r}: {v}" for r, v in bad.items()))
    return res[0][1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--part", choices=("all", "core", "cupy"), default="all",
                    help="core: checks 1-6 (ctypes + libcudart); cupy: check 7 alone, and a missing cupy is an "
                         "error (exit 3); all (default): both, cupy skipped when not installed")
    a = ap.parse_args()
    os.environ.setdefault("HARP_TIMEOUT", "60")
    if a.part in ("all", "core"):
        cudart = find_cudart()
        print(f"libcudart: {cudart}")
        for line in run(rank_main, a.ranks, cudart):
            print(line)
        print(init_all_check(cudart))
    if a.part in ("all", "cupy"):
        try:
            import cupy

            print(f"cupy {cupy.__version__}")
        except ImportError as e:
            if a.part == "cupy":
                print(f"FAILED: cupy not importable: {e}")
                sys.exit(3)
            print("cupy not installed: cupy check skipped (ctypes+cudart checks above cover the device path)")
        else:
            for line in run(cupy_check, a.ranks):
                print(line)
    print("ALL DEVICE CHECKS PASSED" if a.part == "all" else f"ALL DEVICE CHECKS PASSED ({a.part})")


if __name__ == "__main__":
    main()
