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
machines the jobs use.

Between hosts (the RTT term of the cost model): --cluster NAME measures the tcp line
between hosts 0 and 1 of an arena cluster that is up (harp-cluster up ... --delay 500us),
one rank on each, through harp-cluster run; alpha is then half the hosts' round trip:

    harp-cluster up --name vpc --hosts 2 --delay 500us
    PYTHONPATH=python python3 scripts/calibrate.py --cluster vpc > vpc-calib.txt   # tcp ~5e-4
    HARP_CALIBRATION_FILE=vpc-calib.txt harp-config --explain allreduce 8 --ranks 8 --transport tcp

With --cluster the file also states the line's bandwidth-delay product against the kernel's TCP
buffer limits (net.ipv4.tcp_rmem/tcp_wmem) and says when one stream's window cannot cover it.

On real hosts, run `scripts/calibrate.py --worker` as a two-rank job (any launcher
that sets HARP_UNIQUE_ID or HARP_ADDR/HARP_RANK/HARP_WORLD_SIZE); rank 0 prints the line.
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


def worker(iters):
    """One rank of a two-rank job across hosts (launcher environment); rank 0 prints
    'CALIB alpha beta'."""
    comm = harp.init()
    if comm.size != 2:
        raise SystemExit(f"calibrate.py --worker: needs exactly 2 ranks, got {comm.size}")
    res = {}
    for n in (8, 4 << 20):
        buf = np.zeros(n, np.uint8)
        times = []
        for i in range(iters + 3):
            t0 = time.perf_counter()
            if comm.rank == 0:
                comm.send(buf, 1)
                comm.recv(buf, 1)
            else:
                comm.recv(buf, 0)
                comm.send(buf, 0)
            if i >= 3:
                times.append((time.perf_counter() - t0) / 2)
        res[n] = statistics.median(times)
    if comm.rank == 0:
        print(f"CALIB {res[8]:.6g} {max(res[4 << 20] - res[8], 0.0) / (4 << 20):.6g} {tcp_buffer_max('rmem')} "
              f"{tcp_buffer_max('wmem')}", flush=True)
    comm.destroy()


def tcp_buffer_max(which):
    """The largest TCP receive ('rmem') or send ('wmem') buffer the kernel's autotuning gives a socket
    in this network namespace (the third field of net.ipv4.tcp_rmem / tcp_wmem); 0 if unreadable."""
    try:
        with open(f"/proc/sys/net/ipv4/tcp_{which}") as f:
            return int(f.read().split()[2])
    except (OSError, IndexError, ValueError):
        return 0


def window_report(alpha, beta, rmem, wmem):
    """Comment lines on the bandwidth-delay product of the measured line against the kernel's TCP
    buffer limits (a window smaller than the BDP caps one stream below the link rate)."""
    if beta <= 0 or not rmem or not wmem:
        return [], False
    bdp = 2 * alpha / beta  # RTT x bandwidth
    # Linux advertises about half the receive buffer as window (the rest is overhead, tcp_adv_win_scale)
    window = min(rmem // 2, wmem)
    lines = [f"# bandwidth-delay product {bdp / 1024:.0f} KiB (RTT {2 * alpha * 1e6:.0f} us x "
             f"{1 / beta / 1e6:.0f} MB/s); kernel TCP buffers: tcp_rmem max {rmem >> 10} KiB, tcp_wmem max "
             f"{wmem >> 10} KiB, a window of about {window >> 10} KiB per stream"]
    short = window < bdp
    if short:
        lines.append(f"# one TCP stream is capped near {window / (2 * alpha) / 1e6:.0f} MB/s: raise net.ipv4.tcp_rmem "
                     f"and tcp_wmem (their third field) to at least {2 * int(bdp)}, or use lanes "
                     f"(HARP_SOCKET_NSTREAMS)")
    return lines, short


def measure_cluster(name, iters):
    """(alpha, beta, tcp_rmem max, tcp_wmem max) of tcp between hosts 0 and 1 of arena cluster `name`
    (one rank on each; the buffer limits as host 0's network namespace has them)."""
    import subprocess
    # the ranks import harp from where this process did (an installed wheel or a built checkout)
    env = dict(os.environ, HARP_TRANSPORT="tcp", PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(harp.__file__))))
    r = subprocess.run([sys.executable, "-m", "harp_dev.cluster", "run", "--name", name, "--hosts", "2", "--timeout",
                        "600", "--", sys.executable, os.path.abspath(__file__), "--worker", "--iters", str(iters)],
                       capture_output=True, text=True, env=env, timeout=700)
    line = next((l for l in r.stdout.splitlines() if l.startswith("CALIB ")), None)
    if r.returncode or not line:
        raise SystemExit(f"calibrate.py --cluster {name}: the job failed ({r.returncode}): {r.stderr[-2000:]}")
    _, alpha, beta, rmem, wmem = line.split()
    return float(alpha), float(beta), int(rmem), int(wmem)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="calibrate.py", description=__doc__.split("\n")[0])
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--cluster", help="measure tcp between hosts 0 and 1 of this arena cluster (harp-cluster up)")
    ap.add_argument("--worker", action="store_true", help="one rank of a two-host calibration job")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.iters)
        return
    gamma = harp._harp.measure_gamma()
    print(f"# HARP calibration: {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
          f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs (scripts/calibrate.py"
          f"{' --cluster ' + a.cluster if a.cluster else ''})")
    print("# transport  alpha_s  beta_s_per_byte  gamma_s_per_byte")
    if a.cluster:
        alpha, beta, rmem, wmem = measure_cluster(a.cluster, a.iters)
        lines, short = window_report(alpha, beta, rmem, wmem)
        for line in lines:
            print(line)
        if short:
            print("calibrate.py: " + lines[-1][2:], file=sys.stderr)
        print(f"tcp {alpha:.3g} {beta:.3g} {gamma:.3g}")
        return
    for t in a.transports.split(","):
        alpha, beta = measure(t, a.iters)
        print(f"{t} {alpha:.3g} {beta:.3g} {gamma:.3g}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
