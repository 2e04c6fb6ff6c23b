"""Measure an arena link's payload rate with a plain TCP stream (iperf-like, stdlib only).

    python3 bench/vpc/linkrate.py --name vpc --src 1 --dst 0 --seconds 3     # prints MB/s (1e6 B/s)

Starts a receiver inside host dst and a sender inside host src (nsenter into
their holders), sends for --seconds, and reports what the receiver counted
from its first to its last byte. Default: the cluster named vpc.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from harp_dev.cluster import runner, topology as topo  # noqa: E402

RECV = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
print("LISTEN", flush=True)
c, _ = s.accept(); c.settimeout(30); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.monotonic()
    else: n += len(b)
    t1 = time.monotonic()
print(n / (t1 - t0) / 1e6, flush=True)
"""
SEND = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30); buf = b"x" * (1 << 20)
t = time.monotonic()
while time.monotonic() - t < float(sys.argv[3]): s.sendall(buf)
s.close()
"""


def measure(st, src, dst, seconds=3.0, port=5201):
    addr = topo.address(st["slot"], dst)
    rx = subprocess.Popen(runner.nsenter(st["holders"][dst]) + [sys.executable, "-c", RECV, addr, str(port)],
                          stdout=subprocess.PIPE, text=True)
    assert rx.stdout.readline().strip() == "LISTEN"
    subprocess.run(runner.nsenter(st["holders"][src]) + [sys.executable, "-c", SEND, addr, str(port), str(seconds)],
                   check=True, timeout=seconds + 60)
    out, _ = rx.communicate(timeout=60)
    return float(out.strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="vpc")
    ap.add_argument("--src", type=int, default=1)
    ap.add_argument("--dst", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    st = topo.load(a.name)
    if not st:
        sys.exit(f"no arena cluster '{a.name}' is up")
    print(json.dumps({"MBps": measure(st, a.src, a.dst, a.seconds)}))


if __name__ == "__main__":
    main()
