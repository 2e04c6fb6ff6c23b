"""TCP lanes: several TCP connections per peer with adaptive striping.

Real processes over real sockets (tests/harness.py). Small pieces
(HARP_SOCKET_CHUNK=4K, HARP_SOCKET_STRIPE_MIN=8K) make every message of a few
kilobytes travel in several pieces over several lanes, so odd sizes, messages
below and above the threshold, traffic in both directions at once and many
messages in flight are all covered at test sizes. The header checks are also
unit-tested in tests/cpp/test_tcp_wire.cc; here a sending rank corrupts one
header on purpose (HARP_TCP_FAULT) and the receiver must fail cleanly.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import harp
from collectives_check import check_everything
from harness import killed_last_rank, run_ranks


def lanes_env(n, **more):
    env = {"HARP_TRANSPORT": "tcp", "HARP_SOCKET_NSTREAMS": str(n), "HARP_SOCKET_STRIPE_MIN": "8K",
           "HARP_SOCKET_CHUNK": "4K"}
    env.update(more)
    return env


SIZES = [0, 1, 7, 1023, 1024, 2047, 2048, 2049, 4099, 50_001, 262_147]  # float32 counts around 4K/8K bytes


def _p2p(rank, size):
    comm = harp.init(timeout=120)
    peer = 1 - rank
    bad = []
    # One direction, then the other: the sender's messages queue up before the
    # receiver posts (headers arrive for receives not posted yet).
    for sender in (0, 1):
        for i, n in enumerate(SIZES):
            x = (np.arange(n, dtype=np.float32) * 3 + i + 1000 * sender)
            if rank == sender:
                comm.send(x, peer, tag=i)
            else:
                y = np.full(n, -1, np.float32)
                comm.recv(y, peer, tag=i)
                if not np.array_equal(x, y):
                    bad.append((sender, n))
    comm.destroy()
    return bad


@pytest.mark.parametrize("lanes", [1, 2, 3, 8])
def test_point_to_point_over_lanes(lanes):
    res = run_ranks(2, _p2p, env=lanes_env(lanes), timeout=300)
    assert res == [[], []], res


def _both_ways(rank, size, n):
    comm = harp.init(timeout=120)
    outs = []
    # Both directions at once, many messages in flight: alltoall, ring
    # allreduce and allgather of sizes around the stripe threshold.
    for k, m in enumerate((n, n + 1, 3 * n + 5, 1)):
        x = ((np.arange(m * size, dtype=np.int64) * 7 + rank * 11 + k) % 1001).astype(np.float32)
        out = comm.alltoall(x)
        exp = np.concatenate([((np.arange(m * size, dtype=np.int64) * 7 + r * 11 + k) % 1001)
                              .astype(np.float32)[rank * m:(rank + 1) * m] for r in range(size)])
        outs.append(bool(np.array_equal(out, exp)))
        y = x.copy()
        comm.allreduce(y, algo="ring")
        exp = sum(((np.arange(m * size, dtype=np.int64) * 7 + r * 11 + k) % 1001) for r in range(size))
        outs.append(bool(np.array_equal(y, exp.astype(np.float32))))
    works = [comm.allreduce(np.full(5000 + i, float(rank + i), np.float32), async_op=True) for i in range(8)]
    outs += [bool(np.all(w.wait() == sum(r + i for r in range(size)))) for i, w in enumerate(works)]
    comm.destroy()
    return outs


@pytest.mark.parametrize("nranks,lanes", [(3, 4), (5, 3)])
def test_both_directions_many_in_flight(nranks, lanes):
    res = run_ranks(nranks, _both_ways, 3001, env=lanes_env(lanes), timeout=300)
    for outs in res:
        assert outs and all(outs), outs


def _everything(rank, size):
    comm = harp.init(timeout=120)
    failures, calls = check_everything(comm, (0, 7, 1031, 2500))
    comm.destroy()
    return failures, calls


def test_every_collective_over_four_lanes():
    res = run_ranks(3, _everything, env=lanes_env(4), timeout=600)
    failures = [f for fs, _ in res for f in fs]
    assert sum(c for _, c in res) > 1500  # the matrix really ran
    assert not failures, "\n".join(failures[:30])


def _mismatch(rank, size):
    comm = harp.init(timeout=60)
    try:
        if rank == 0:
            comm.send(np.ones(20_000, np.float32), 1, tag=5)
            comm.barrier()
        else:
            comm.recv(np.ones(20_001, np.float32), 0, tag=5)
    except harp.HarpError as e:
        return type(e).__name__, str(e)
    return "no error", ""


def test_length_mismatch_detected_across_lanes():
    res = run_ranks(2, _mismatch, env=lanes_env(4), timeout=120, allow_errors=True)
    status, (cls, msg) = res[1]
    assert status == "ok" and cls == "MismatchError", res[1]
    # the sender learns too (its next collective with the broken pair fails)
    assert res[0][0] == "ok" and res[0][1][0] in ("PeerError", "MismatchError"), res[0]


def test_killed_peer_raises_peer_error_on_every_rank():
    env = lanes_env(4, HARP_SOCKET_STRIPE_MIN="64K", HARP_SOCKET_CHUNK="32K")
    res = run_ranks(4, killed_last_rank, 1_000_003, 0.05, env=env, timeout=180, allow_errors=True)
    assert res[-1][0] == "died"
    for status, val in res[:-1]:
        assert status == "ok", val
        cls, msg, _ = val
        assert cls == "PeerError", (cls, msg)
        assert "rank" in msg


def _fault(rank, size, fault):
    if rank == 0:
        os.environ["HARP_TCP_FAULT"] = fault
    comm = harp.init(timeout=30)
    x = np.arange(5000, dtype=np.float32)  # 20000 bytes: 5 pieces of 4K
    try:
        if rank == 0:
            comm.send(x, 1)
            # Stay alive until rank 1 has judged the frame (its abort ends this
            # wait): an exit now would let rank 1's keep-alive see a closed port
            # first, on a loaded machine, and name that instead.
            try:
                comm.recv(np.zeros(1, np.float32), 1, timeout=30)
            except harp.HarpError:
                pass
            return "sent", ""
        y = np.zeros(6000, np.float32)  # room beyond the message: nothing may land there
        comm.recv(y[:5000], 0)
        return "received", str(np.array_equal(y[:5000], x))
    except harp.HarpError as e:
        if rank == 1:
            assert not y[5000:].any(), "bytes written past the posted buffer"
        return type(e).__name__, str(e)


@pytest.mark.parametrize("fault,words", [("offset", "beyond message length"), ("align", "not a multiple"),
                                         ("flags", "unknown frame flags"), ("kind", "bad frame kind"),
                                         ("dup", "arrived twice")])
def test_corrupt_piece_header_fails_the_pair(fault, words):
    res = run_ranks(2, _fault, fault, env=lanes_env(3), timeout=120)
    cls, msg = res[1]
    assert cls == "PeerError", res
    assert "corrupt frame from rank 0" in msg and words in msg, msg


def _congestion(rank, size):
    try:
        comm = harp.init(timeout=30)
    except harp.HarpError as e:
        return type(e).__name__, str(e)
    x = np.full(100_000, rank + 1.0, np.float32)
    comm.allreduce(x)
    comm.destroy()
    return "ok", str(float(x[0]))


def _available_cc():
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        return f.read().split()


def test_tcp_congestion_accepted_and_refused():
    cc = "reno" if "reno" in _available_cc() else _available_cc()[0]
    res = run_ranks(2, _congestion, env=lanes_env(2, HARP_TCP_CONGESTION=cc), timeout=120)
    assert res == [("ok", "3.0"), ("ok", "3.0")], res
    res = run_ranks(2, _congestion, env=lanes_env(2, HARP_TCP_CONGESTION="nosuchcc"), timeout=120)
    for cls, msg in res:  # every rank refuses, naming the algorithm
        assert cls == "InvalidArgumentError" and "nosuchcc" in msg and "available here" in msg, (cls, msg)


AUTO_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import harp
from harness import run_ranks

def rank_fn(rank, size):
    comm = harp.init(timeout=60)
    x = np.full(300_001, rank + 1.0, np.float32)
    comm.allreduce(x)
    comm.destroy()
    return float(x[-1])

print("RESULT", run_ranks(2, rank_fn, timeout=120))
"""


def _run_auto(**more):
    # A fresh interpreter: the log level is read once per process (HARP_DEBUG=INFO shows the probe).
    env = dict(os.environ, **lanes_env("auto", HARP_DEBUG="INFO", HARP_SOCKET_PROBE_BYTES="1M",
                                       HARP_SOCKET_STRIPE_MIN="64K", HARP_SOCKET_CHUNK="16K"), **more)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(harp.__path__[0]), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", AUTO_SCRIPT, os.path.dirname(__file__)], env=env,
                       capture_output=True, text=True, timeout=180)
    assert "RESULT [3.0, 3.0]" in r.stdout, (r.stdout, r.stderr[-3000:])
    return r.stderr


def _core_max(which):
    with open(f"/proc/sys/net/core/{which}_max") as f:
        return int(f.read())


def test_socket_bufsize_reports_what_the_kernel_allowed():
    cap = min(_core_max("rmem"), _core_max("wmem"))
    big = min(4 * max(_core_max("rmem"), _core_max("wmem")), 1 << 30)
    log = _run_auto(HARP_SOCKET_BUFSIZE=str(big))
    m = re.search(r"HARP_SOCKET_BUFSIZE=(\d+): the kernel allowed SO_SNDBUF (\d+) and SO_RCVBUF (\d+) bytes \(capped",
                  log)
    assert m and int(m.group(1)) == big and int(m.group(2)) < big and int(m.group(3)) < big, log[-3000:]
    small = cap // 4
    log = _run_auto(HARP_SOCKET_BUFSIZE=str(small))
    m = re.search(r"HARP_SOCKET_BUFSIZE=(\d+): the kernel allowed SO_SNDBUF (\d+) and SO_RCVBUF (\d+) bytes$", log,
                  re.M)
    assert m and int(m.group(2)) >= small and int(m.group(3)) >= small, log[-3000:]
    assert "capped" not in log, log[-3000:]


def test_auto_streams_resolve_to_a_number():
    log = _run_auto(HARP_SOCKET_PROBE_LOCAL="1")
    sender = re.search(r"rank 0 to rank 1 .*lane probe( \d+:\d+MB/s)+ -> keep (\d+) lane", log)
    receiver = re.search(r"rank 1 to rank 0 .*lane probe kept (\d+) lane", log)
    assert sender and receiver, log[-3000:]
    assert sender.group(2) == receiver.group(1) and int(receiver.group(1)) in (1, 2, 4, 8)
    # without the local probe, peers on one host get one lane and no probe
    log = _run_auto()
    assert "lane probe" not in log
    assert re.search(r"rank 0 to rank 1 .*: 1 lane\(s\)", log) and re.search(r"rank 1 to rank 0 .*: 1 lane\(s\)", log), log


RAILS_JOB = """
import numpy as np, harp
comm = harp.init(timeout=120)
x = np.full((8 << 20) // 4 + 3, comm.rank + 1.0, np.float32)
comm.allreduce(x)
assert x[0] == 3.0 and x[-1] == 3.0, (x[0], x[-1])
comm.destroy()
print("RAILS-OK")
"""


def _tx_bytes(ns, dev):
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"],
                         capture_output=True, text=True, timeout=30).stdout
    return int(out.strip())


@pytest.mark.slow
def test_lanes_spread_over_two_nics():
    """HARP_SOCKET_IFNAME=eth0,eth1 with 2 lanes: each NIC of each host carries part of an 8 MB allreduce."""
    from harp_dev.cluster import net, topology as topo
    from test_cluster import _name, _skip_reason

    why = _skip_reason()
    if why:
        pytest.skip(why)
    name = _name("rl")
    st = net.up(name, 2, rate="1gbit", nics=2)
    try:
        ns = [topo.host_ns(name, i) for i in range(2)]
        before = {(n, d): _tx_bytes(n, d) for n in ns for d in ("eth0", "eth1")}
        env = dict(os.environ, HARP_TRANSPORT="tcp", HARP_SOCKET_NSTREAMS="2", HARP_SOCKET_IFNAME="eth0,eth1",
                   HARP_SOCKET_STRIPE_MIN="64K", HARP_SOCKET_CHUNK="64K")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(harp.__path__[0]), env.get("PYTHONPATH")) if p)
        r = subprocess.run([sys.executable, "-m", "harp_dev.cluster", "run", "--name", name, "--hosts", "2", "--timeout",
                            "120", "--", sys.executable, "-c", RAILS_JOB], capture_output=True, text=True, env=env,
                           timeout=240)
        assert r.returncode == 0 and r.stdout.count("RAILS-OK") == 2, (r.stdout, r.stderr[-3000:])
        sent = {k: _tx_bytes(*k) - v for k, v in before.items()}
        for n in ns:  # both rails of both hosts carried a real share (the allreduce moves ~8 MB each way)
            assert sent[(n, "eth0")] > 1 << 20 and sent[(n, "eth1")] > 1 << 20, sent
    finally:
        problems = net.down(st)
    assert problems == []
