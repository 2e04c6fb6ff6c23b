#!/usr/bin/env python3
"""scripts/calibrate.py — measure the cost model's transport parameters and print a
calibration file for HARP_CALIBRATION_FILE (format: core/select/cost.h).

    PYTHONPATH=python python3 scripts/calibrate.py [--transports tcp,shm] [--iters N] > harp-calib.txt
    HARP_CALIBRATION_FILE=harp-calib.txt harp-config --explain allreduce 4M --ranks 8 --transport tcp

Per transport, two ranks on this host ping-pong with send/recv:
  alpha = half the round trip of an 8-byte message (seconds; includes the Python call, ~1 us)
  beta  = (half the round trip of a 4 MiB message - alpha) / 4 MiB (seconds per byte)
  gamma = the reduction kernel's time per byte (float32 sum, 4 MiB, this process;
          harp._harp.measure_gamma), the same for every transport.
The median of the repetitions is taken, so a busy machine skews less. Run it on the
machines the jobs use (ranks on different hosts: run a two-host job by hand and
write the tcp/verbs lines yourself; the format is one line per transport).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

import harp


def _pingpong(rank, uid_hex, transport, sizes, iters, q):
    os.environ.update({"HARP_UNIQUE_ID": uid_hex, "HARP_RANK": str(rank), "HARP_WORLD_SIZE": "2",
                       "HARP_LOCAL_RANK": str(rank), "HARP_TRANSPORT": transport})
    comm = harp.init()
    out = {}
    for n in sizes:
        buf = np.zeros(n, np.uint8)
        times = []
        for i in range(iters + 3):
            t0 = time.perf_counter()
            if rank == 0:
                comm.send(buf, 1)
                comm.recv(buf, 1)
            else:
                comm.recv(buf, 0)
                comm.send(buf, 0)
            if i >= 3:  # warm-up
                times.append((time.perf_counter() - t0) / 2)
        out[n] = statistics.median(times)
    comm.destroy()
    q.put((rank, out))


def measure(transport, iters):
    ctx = mp.get_context("fork")
    uid = harp.get_unique_id("127.0.0.1:0")
    q = ctx.Queue()
    sizes = (8, 4 << 20)
    procs = [ctx.Process(target=_pingpong, args=(r, uid.hex(), transport, sizes, iters, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    half = res[0]
    alpha = half[8]
    beta = max(half[4 << 20] - alpha, 0.0) / (4 << 20)
    return alpha, beta


def main(argv=None):
    ap = argparse.ArgumentParser(prog="calibrate.py", description=__doc__.split("\n")[0])
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args(argv)
    gamma = harp._harp.measure_gamma()
    print(f"# HARP calibration: {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
          f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs (scripts/calibrate.py)")
    print("# transport  alpha_s  beta_s_per_byte  gamma_s_per_byte")
    for t in a.transports.split(","):
        alpha, beta = measure(t, a.iters)
        print(f"{t} {alpha:.3g} {beta:.3g} {gamma:.3g}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
