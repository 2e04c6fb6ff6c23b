"""Iperf-like TCP flows between two arena hosts, for tests/test_flowcap.py and bench/vpc/lanes_bench.py.

    python3 tests/flowrate.py serve PORT NFLOWS                 # in the receiving host's namespace
    python3 tests/flowrate.py send HOST PORT NFLOWS SECONDS [SPORT]  # in the sending host's namespace

The sender opens NFLOWS connections, writes on all of them for SECONDS, and the
server prints one JSON line: total bytes received per flow and the measuring
time (from the first byte to the last), so the rate is what the network gave.
Blocking calls all have timeouts.
"""
import json
import selectors
import socket
import sys
import time


def serve(port, nflows, timeout=60):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(nflows)
    ls.settimeout(timeout)
    print("READY", flush=True)
    conns = [ls.accept()[0] for _ in range(nflows)]
    sel = selectors.DefaultSelector()
    got = {}
    for c in conns:
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ)
        got[c] = 0
    first = last = None
    open_ = len(conns)
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(1.0):
            data = key.fileobj.recv(1 << 20)
            if not data:
                sel.unregister(key.fileobj)
                open_ -= 1
                continue
            now = time.monotonic()
            first = first or now
            last = now
            got[key.fileobj] += len(data)
    per = [got[c] for c in conns]
    secs = (last - first) if first and last else 0.0
    print(json.dumps({"bytes": per, "seconds": secs, "rate_bps": [8 * b / secs if secs else 0 for b in per]}))


def send(host, port, nflows, seconds, sport=0):
    # sport: bind flow i to source port sport + i (0: ephemeral), so a flow can be throttled by port
    socks = [socket.create_connection((host, port), timeout=30, source_address=("0.0.0.0", sport + i if sport else 0))
             for i in range(nflows)]
    buf = b"\0" * (1 << 16)
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_WRITE)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, _ in sel.select(0.5):
            try:
                key.fileobj.send(buf)
            except BlockingIOError:
                pass
    for s in socks:
        s.close()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),
             int(sys.argv[6]) if len(sys.argv) > 6 else 0)
