"""Keep-alive security: a forged ICMP "port unreachable" must not kill a live peer.

The keep-alive (core/ft/keepalive.h) reads ICMP errors on its UDP socket as a hint
that a peer's process is gone. ICMP is not authenticated: anyone who can send a
raw packet to a rank's host can forge one quoting the two keep-alive ports. The
hint must be confirmed by a signed probe the peer does not answer; a live peer
answers and stays in the job.

Here two real ranks on loopback run allreduces (tcp and shm) while the test
process, as root, sends forged ICMP port-unreachable packets from a raw socket
to both ranks, quoting their keep-alive ports in both directions, several times.
The ranks must keep computing right and report nobody failed. That a killed
rank is still found within a round trip is tests/test_ft.py's and
tests/test_failures.py's business (and tests/test_security_keepalive's last test,
which checks the message says the port was closed, not a timeout).
"""
import os
import signal
import socket
import struct
import time

import numpy as np
import pytest

import harp
from harness import own_socket_inodes, run_ranks

KA = {"HARP_KEEPALIVE_INTERVAL": "0.5", "HARP_KEEPALIVE_TIMEOUT": "2", "HARP_TIMEOUT": "60"}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a raw ICMP socket")


def keepalive_port():
    """This process's keep-alive UDP port (the only UDP socket a rank owns)."""
    inodes = own_socket_inodes()
    ports = []
    for table in ("/proc/self/net/udp", "/proc/self/net/udp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[9] in inodes:
                    ports.append(int(cols[1].split(":")[1], 16))
    assert len(ports) == 1, f"expected one UDP socket (the keep-alive), found ports {ports}"
    return ports[0]


def _checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def forged_port_unreachable(src_port, dst_port):
    """ICMP type 3 code 3 quoting a UDP datagram 127.0.0.1:src_port -> 127.0.0.1:dst_port:
    what the kernel sends back when dst_port has no socket."""
    lo = socket.inet_aton("127.0.0.1")
    udp = struct.pack("!HHHH", src_port, dst_port, 8 + 48, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 8 + 48, 0, 0x4000, 64, socket.IPPROTO_UDP, 0, lo, lo)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    body = ip + udp
    return struct.pack("!BBHI", 3, 3, _checksum(struct.pack("!BBHI", 3, 3, 0, 0) + body), 0) + body


def _allreduce_until_told(rank, size, d):
    comm = harp.init()
    with open(os.path.join(d, f"port.{rank}.tmp"), "w") as f:
        f.write(str(keepalive_port()))
    os.replace(os.path.join(d, f"port.{rank}.tmp"), os.path.join(d, f"port.{rank}"))
    done, after, wrong = False, 0, 0
    try:
        while not done:
            # [rank-dependent data..., attack seen, stop]: every rank leaves at the same step.
            x = np.array([rank + 1.0] * 1000 + [os.path.exists(os.path.join(d, "attacked")),
                                                os.path.exists(os.path.join(d, "stop"))])
            comm.allreduce(x)
            wrong += not np.array_equal(x[:1000], np.full(1000, size * (size + 1) / 2))
            after += x[-2] > 0
            done = x[-1] > 0
        err = ("no error", "")
    except harp.HarpError as e:
        err = (type(e).__name__, str(e))
    failed = comm.failed_ranks()
    comm.destroy()
    return err, int(after), int(wrong), failed


@needs_root
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_forged_icmp_port_unreachable_does_not_kill_a_live_peer(tmp_path, transport):
    d = str(tmp_path)
    import multiprocessing as mp

    res = {}

    def attacker():
        end = time.monotonic() + 60
        while not all(os.path.exists(os.path.join(d, f"port.{r}")) for r in range(2)):
            assert time.monotonic() < end, "ranks never published their keep-alive ports"
            time.sleep(0.01)
        p0, p1 = (int(open(os.path.join(d, f"port.{r}")).read()) for r in range(2))
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        open(os.path.join(d, "attacked"), "w").close()
        # Each rank's socket is told its beats to the other bounce: several
        # times, spread over more than a keep-alive interval and a probe bound.
        for _ in range(8):
            raw.sendto(forged_port_unreachable(p0, p1), ("127.0.0.1", 0))
            raw.sendto(forged_port_unreachable(p1, p0), ("127.0.0.1", 0))
            time.sleep(0.15)
        raw.close()
        time.sleep(1.0)  # well past any verdict the forgeries could have drawn
        open(os.path.join(d, "stop"), "w").close()

    ctx = mp.get_context("fork")
    a = ctx.Process(target=attacker, daemon=True)
    a.start()
    try:
        res = run_ranks(2, _allreduce_until_told, d, env={**KA, "HARP_TRANSPORT": transport}, timeout=90)
    finally:
        a.join(5)
        if a.is_alive():
            a.kill()
    assert a.exitcode == 0, "the attacker failed"
    for r, (err, after, wrong, failed) in enumerate(res):
        assert err == ("no error", ""), f"rank {r} failed under forged ICMP: {err}"
        assert failed == [], f"rank {r} reports live ranks {failed} dead"
        assert after > 0 and wrong == 0, (r, after, wrong)


def _killed_peer_named_by_closed_port(rank, size):
    comm = harp.init()
    x = np.ones(1 << 12, np.float32)
    comm.allreduce(x)
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(1_000_000):
            comm.allreduce(x)
        return "no error", "", 0.0
    except harp.HarpError as e:
        return type(e).__name__, str(e), time.monotonic() - t0


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_killed_rank_is_still_found_by_its_closed_port(transport):
    # The confirmation (a signed probe nobody answers) keeps the closed-port
    # verdict: the keep-alive names the rank from its port, not its timeout.
    res = run_ranks(3, _killed_peer_named_by_closed_port, env={**KA, "HARP_TRANSPORT": transport},
                    timeout=90, allow_errors=True)
    assert res[-1][0] == "died"
    for status, (cls, msg, dt) in res[:-1]:
        assert status == "ok" and cls == "PeerError", (cls, msg)
        assert "rank 2" in msg, msg
