"""HARP's device-pointer allreduce vs its host-buffer path, and the host<->device copy bandwidth.

    python bench/gpu/allreduce_device.py [--ranks 2] [--min 1K] [--max 256M] [--json PATH] [--budget-s 150]

Run by scripts/gpu-check.sh on the GPU machine; bench/RESULTS-gpu.md says how to read it. Uses
libharp-nccl.so through harp.nccl (ctypes) and the CUDA runtime through ctypes (the Cuda class of
tests/nccl/device_check.py; HARP_CUDART picks the library, e.g. tests/nccl/emu_cudart.c for a dry
run without a GPU). Ranks are spawned processes sharing device LOCAL_RANK % device count.

Per size (float32 SUM, out of place, sizes x4 from --min to --max), each rank times every call
(ncclAllReduce + cudaStreamSynchronize on a non-default stream) and reports the median:
  device: cudaMalloc'ed send/recv buffers (HARP stages them through pinned host memory);
  host:   ordinary (pageable) numpy buffers, the same communicator and call.
The iteration count is agreed between ranks (max over ranks, from a timed first call, for about
--target-s per size and path). Rank 0's medians are reported, with algbw = bytes / time and
busbw = algbw * 2 (n-1) / n (NCCL's convention). The result of the last device call is checked
(first and last elements) at every size.
Then, in the parent, cudaMemcpy bandwidth host->device and device->host, pinned (cudaHostAlloc)
and pageable, at 1 MiB, 16 MiB and --max: the staging limit. "staging model" is the host-path time
plus one device->host and one host->device pinned copy of the buffer, i.e. what an unpipelined
staging costs; the measured device time is compared with it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "nccl"))
import device_check as dc  # noqa: E402  (load_nccl, find_cudart, Cuda)


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def human(n: int) -> str:
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return str(n)


def rank_main(rank, size, uid, cudart, sizes, target_s, budget_s, q):
    try:
        os.environ["HARP_CUDART"] = cudart
        cu = dc.Cuda(cudart)
        n = ctypes.c_int()
        cu.ok(cu.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        cu.ok(cu.lib.cudaSetDevice(rank % n.value), "cudaSetDevice")
        nccl = dc.load_nccl()
        c = nccl.NcclCommunicator(size, uid, rank)
        s = cu.stream()
        big = max(sizes)
        cnt_big = big // 4
        dsend, drecv = cu.malloc(big), cu.malloc(big)
        cu.put(dsend, np.full(cnt_big, rank + 1, np.float32))
        hsend = np.full(cnt_big, rank + 1, np.float32)
        hrecv = np.zeros(cnt_big, np.float32)
        flag = np.zeros(1, np.int64)
        want = size * (size + 1) / 2
        t_start = time.monotonic()
        rows = []

        def agree(v: int) -> int:  # max over ranks, through HARP's host path
            flag[0] = v
            c.allReduce(flag.ctypes.data, flag.ctypes.data, 1, nccl.NCCL_INT64, nccl.NCCL_MAX, s)
            cu.sync(s)
            return int(flag[0])

        def timed(send, recv, count):
            t = time.perf_counter()
            c.allReduce(send, recv, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s)
            cu.sync(s)
            return time.perf_counter() - t

        for nbytes in sizes:
            over = agree(int(time.monotonic() - t_start > budget_s))
            if over:
                rows.append({"bytes": nbytes, "skipped": "budget"})
                continue
            count = nbytes // 4
            row = {"bytes": nbytes}
            for path, send, recv in (("device", dsend, drecv), ("host", hsend.ctypes.data, hrecv.ctypes.data)):
                first = timed(send, recv, count)  # warm-up (first use of a size sets up staging)
                first = max(first, timed(send, recv, count))
                iters = agree(max(3, min(200, int(target_s / max(first, 1e-6)))))
                ts = [timed(send, recv, count) for _ in range(iters)]
                med = statistics.median(ts)
                row[path] = {"iters": iters, "median_us": med * 1e6, "min_us": min(ts) * 1e6,
                             "algbw_GBps": nbytes / med / 1e9, "busbw_GBps": nbytes / med / 1e9 * 2 * (size - 1) / size}
            # check the device result: first and last element
            probe = np.zeros(1, np.float32)
            for off in (0, (count - 1) * 4):
                cu.ok(cu.lib.cudaMemcpy(probe.ctypes.data, drecv + off, 4, cu.DEFAULT), "cudaMemcpy D2H")
                if probe[0] != want:
                    row["error"] = f"device result {probe[0]} at byte {off}, want {want}"
            if hrecv[0] != want or hrecv[count - 1] != want:
                row["error"] = f"host result {hrecv[0]}/{hrecv[count - 1]}, want {want}"
            rows.append(row)
        c.destroy()
        q.put((rank, "ok", rows))
    except BaseException as e:  # noqa: BLE001
        import traceback

        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def copy_bandwidth(cudart, sizes, reps=5):
    cu = dc.Cuda(cudart)
    cu.ok(cu.lib.cudaSetDevice(0), "cudaSetDevice")
    out = []
    big = max(sizes)
    dev = cu.malloc(big)
    pinned = ctypes.c_void_p()
    cu.ok(cu.lib.cudaHostAlloc(ctypes.byref(pinned), big, 0), "cudaHostAlloc")
    pageable = np.ones(big, np.uint8)
    for nbytes in sizes:
        row = {"bytes": nbytes}
        for kind, host in (("pinned", pinned.value), ("pageable", pageable.ctypes.data)):
            for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
                cu.ok(cu.lib.cudaMemcpy(dst, src, nbytes, cu.DEFAULT), "cudaMemcpy")  # warm-up
                ts = []
                for _ in range(reps):
                    t = time.perf_counter()
                    cu.ok(cu.lib.cudaMemcpy(dst, src, nbytes, cu.DEFAULT), "cudaMemcpy")
                    ts.append(time.perf_counter() - t)
                row[f"{name}_{kind}_GBps"] = nbytes / statistics.median(ts) / 1e9
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min", default="1K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--target-s", type=float, default=0.2, help="timed seconds per size and path (about)")
    ap.add_argument("--budget-s", type=float, default=150, help="sizes not started by then are skipped")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    lo, hi = parse_size(a.min), parse_size(a.max)
    sizes, b = [], lo
    while b <= hi:
        sizes.append(b)
        b *= 4
    if sizes[-1] != hi:
        sizes.append(hi)
    cudart = dc.find_cudart()
    os.environ.setdefault("HARP_TIMEOUT", "60")
    print(f"libcudart: {cudart}; {a.ranks} ranks; sizes {human(sizes[0])}..{human(sizes[-1])}")
    ctx = mp.get_context("spawn")
    uid = bytes((x + 256) % 256 for x in dc.load_nccl().get_unique_id())
    q = ctx.Queue()
    ps = [ctx.Process(target=rank_main, args=(r, a.ranks, uid, cudart, sizes, a.target_s, a.budget_s, q))
          for r in range(a.ranks)]
    t0 = time.monotonic()
    for p in ps:
        p.start()
    res = dc.collect(ps, q, a.ranks, a.timeout)
    out = {"ranks": a.ranks, "cudart": cudart, "transport": os.environ.get("HARP_TRANSPORT", "(default)"),
           "status": "fail", "allreduce": [], "copy": []}
    errors = []
    if len(res) < a.ranks:
        errors.append(f"ranks {sorted(set(range(a.ranks)) - set(res))} hung or died")
    errors += [f"rank {r}: {v}" for r, (st, v) in sorted(res.items()) if st != "ok"]
    if not errors:
        out["allreduce"] = res[0][1]
        errors += [f"{human(r['bytes'])}: {r['error']}" for rr in res.values() for r in rr[1] if "error" in r]
    out["allreduce_s"] = round(time.monotonic() - t0, 1)
    try:
        t1 = time.monotonic()
        out["copy"] = copy_bandwidth(cudart, sorted({min(1 << 20, hi), min(16 << 20, hi), hi}))
        out["copy_s"] = round(time.monotonic() - t1, 1)
    except Exception as e:  # noqa: BLE001
        errors.append(f"copy bandwidth: {type(e).__name__}: {e}")
    pinned = {r["bytes"]: r for r in out["copy"]}

    def staging_model(nbytes, host_us):
        # host time + one D2H and one H2D pinned copy at the closest measured size's bandwidth
        if not pinned:
            return None
        r = pinned[min(pinned, key=lambda k: abs(k - nbytes))]
        return host_us + nbytes / (r["d2h_pinned_GBps"] * 1e9) * 1e6 + nbytes / (r["h2d_pinned_GBps"] * 1e9) * 1e6

    print(f"\nallreduce float32 SUM, {a.ranks} ranks, rank 0 medians (us), algbw GB/s")
    print(f"{'bytes':>6} {'device us':>11} {'host us':>11} {'dev/host':>8} {'dev GB/s':>9} {'host GB/s':>9} "
          f"{'model us':>10}")
    for r in out["allreduce"]:
        if "device" not in r:
            print(f"{human(r['bytes']):>6} skipped ({r.get('skipped', r.get('error'))})")
            continue
        d, h = r["device"], r["host"]
        m = staging_model(r["bytes"], h["median_us"])
        r["staging_model_us"] = m
        print(f"{human(r['bytes']):>6} {d['median_us']:11.1f} {h['median_us']:11.1f} {d['median_us'] / h['median_us']:8.2f} "
              f"{d['algbw_GBps']:9.2f} {h['algbw_GBps']:9.2f} {m if m is None else f'{m:10.1f}'}"
              f"{'  ERROR ' + r['error'] if 'error' in r else ''}")
    if out["copy"]:
        print("\ncudaMemcpy bandwidth GB/s (median of 5)")
        print(f"{'bytes':>6} {'h2d pinned':>11} {'d2h pinned':>11} {'h2d pageable':>13} {'d2h pageable':>13}")
        for r in out["copy"]:
            print(f"{human(r['bytes']):>6} {r['h2d_pinned_GBps']:11.2f} {r['d2h_pinned_GBps']:11.2f} "
                  f"{r['h2d_pageable_GBps']:13.2f} {r['d2h_pageable_GBps']:13.2f}")
    out["errors"] = errors
    out["status"] = "fail" if errors else "pass"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if errors:
        print("FAILED:\n" + "\n".join(errors))
        sys.exit(1)
    print("BENCH DONE")


if __name__ == "__main__":
    main()
