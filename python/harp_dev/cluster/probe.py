"""What an arena link delivers, measured from inside two host namespaces (harp-cluster probe).

    python -m harp_dev.cluster.probe server ADDR PORT          # in the far host's namespace
    python -m harp_dev.cluster.probe client ADDR PORT [--rounds 300] [--stream 2] [--udp 20000]

The client prints one JSON line: `rtt_us` (median, min, p90 of TCP ping-pongs of one byte with
TCP_NODELAY, after 20 warm-up rounds), `stream_MBps` (one TCP stream for --stream seconds, counted
by the server) and `udp_loss` (fraction of --udp numbered 1000-byte datagrams, paced at about
10 MB/s, that did not arrive). net.py uses the RTT to calibrate the delay line; tests and
`harp-cluster probe` compare all three with what was asked. Every socket wait has a timeout.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time

TIMEOUT = 20.0


def serve(addr: str, port: int) -> None:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(4)
    us = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # room for a scheduling stall: a full receive buffer would count as loss on the wire
        us.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
    except OSError:
        us.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    us.bind((addr, port))
    us.settimeout(TIMEOUT)
    print("READY", flush=True)
    ls.settimeout(TIMEOUT)
    while True:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            return
        c.settimeout(TIMEOUT)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = c.recv(1)
        if kind == b"p":  # ping-pong
            while True:
                b = c.recv(1)
                if not b:
                    break
                c.sendall(b)
        elif kind == b"s":  # stream: count until the client shuts down its side
            n = 0
            while True:
                b = c.recv(1 << 20)
                if not b:
                    break
                n += len(b)
            c.sendall(b"%d" % n)
        elif kind == b"u":  # UDP: count datagrams until the client says how many it sent
            seen = set()
            us.settimeout(0.5)
            sent = None
            c.setblocking(False)
            while sent is None or len(seen) < sent:
                try:
                    d, _ = us.recvfrom(2048)
                    seen.add(struct.unpack_from("!I", d)[0])
                except socket.timeout:
                    if sent is not None:
                        break
                except BlockingIOError:
                    pass
                try:
                    got = c.recv(32)
                    if got:
                        sent = int(got)
                except BlockingIOError:
                    pass
            c.setblocking(True)
            c.sendall(b"%d" % len(seen))
        elif kind == b"q":
            c.close()
            return
        c.close()


def _rtt(addr, port, rounds):
    c = socket.create_connection((addr, port), timeout=TIMEOUT)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"p")
    ts = []
    for _ in range(rounds + 20):
        t = time.perf_counter()
        c.sendall(b"x")
        if not c.recv(1):
            raise RuntimeError("probe: the server closed the ping-pong")
        ts.append(time.perf_counter() - t)
    c.close()
    ts = sorted(ts[20:])
    return {"median": statistics.median(ts) * 1e6, "min": ts[0] * 1e6, "p90": ts[int(len(ts) * 0.9)] * 1e6}


def _stream(addr, port, seconds):
    c = socket.create_connection((addr, port), timeout=TIMEOUT)
    c.sendall(b"s")
    b = b"x" * (1 << 20)
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        c.sendall(b)
    c.shutdown(socket.SHUT_WR)
    got = int(c.recv(64))
    el = time.perf_counter() - t
    c.close()
    return got / el / 1e6


def _udp(addr, port, n):
    c = socket.create_connection((addr, port), timeout=TIMEOUT)
    c.sendall(b"u")
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pad = b"\0" * 996
    t0 = time.perf_counter()
    for i in range(n):
        u.sendto(struct.pack("!I", i) + pad, (addr, port))
        if i % 32 == 31:  # ~10 MB/s, sleeping between bursts: no queue on the path fills, no core is held
            ahead = t0 + (i + 1) * 1000 / 10e6 - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
    time.sleep(0.2)
    c.sendall(b"%d" % n)
    got = int(c.recv(64))
    c.close()
    return 1 - got / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["server", "client", "stop"])
    ap.add_argument("addr")
    ap.add_argument("port", type=int)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--stream", type=float, default=0.0, help="seconds of one TCP stream (0: none)")
    ap.add_argument("--udp", type=int, default=0, help="datagrams for the loss count (0: none)")
    a = ap.parse_args(argv)
    if a.role == "server":
        serve(a.addr, a.port)
        return 0
    if a.role == "stop":
        c = socket.create_connection((a.addr, a.port), timeout=TIMEOUT)
        c.sendall(b"q")
        c.close()
        return 0
    out = {"rtt_us": _rtt(a.addr, a.port, a.rounds)}
    if a.stream > 0:
        out["stream_MBps"] = _stream(a.addr, a.port, a.stream)
    if a.udp > 0:
        out["udp_loss"] = _udp(a.addr, a.port, a.udp)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
