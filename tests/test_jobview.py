"""The job view (core/observe/jobview.h, harp-status --job): real rank processes and sockets.

Ranks loop allreduces; the tests stop (SIGSTOP), kill or mis-call one rank and ask the whole job from
two places (a local rank's status socket, and --rank-addr with HARP_JOBVIEW_KEY as from a host without
a rank; HARP_HOSTID fakes two hosts), in text and JSON. Refusals: no key, a wrong key, malformed and
oversized requests (hypothesis), each leaving the rank answering the right key afterwards.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

import harness
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harp import status

# The tool runs with the harp the tests imported (CI installs the wheel; the source tree has no build).
PY = os.path.dirname(os.path.dirname(os.path.abspath(status.__file__)))


def looping(rank, size, mode, flag):
    """Two fake hosts; allreduces until every rank agrees to stop (a max-allreduce of `flag` existing),
    then the scenario's end ("hang": a peer's failure is caught, the rank stays): "loop" returns, "mismatch" makes the last rank call broadcast where the others
    call allreduce, then every rank waits to be killed (its record stays as the hang left it)."""
    import numpy as np

    import harp

    os.environ["HARP_HOSTID"] = "hostA" if rank < size // 2 else "hostB"
    comm = harp.init(timeout=120)
    x = np.ones(64, np.float32)
    i = 0
    try:
        while True:
            comm.allreduce(x)
            i += 1
            if i % 50 == 0:
                stop = np.array([1.0 if os.path.exists(flag) else 0.0], np.float32)
                comm.allreduce(stop, op="max")
                if stop[0]:
                    break
    except harp.HarpError:  # a peer killed: the communicator stays (broken) for the view
        if mode == "loop":
            raise
    if mode == "mismatch":
        try:
            if rank == size - 1:
                comm.broadcast(x, root=0)
            else:
                comm.allreduce(x)
        except harp.HarpError:
            pass
    while mode != "loop":
        time.sleep(1)
    return i


@pytest.fixture
def job(tmp_path):
    """start(n, mode) -> (procs, sockets by rank); ranks are killed at teardown."""
    sdir = tmp_path / "status"
    sdir.mkdir(mode=0o700)
    started = []

    def start(n, mode="hang", extra=None):
        env = {"HARP_STATUS_DIR": str(sdir), "HARP_KEEPALIVE_TIMEOUT": "120", "HARP_TRANSPORT": "tcp",
               "HARP_STALL_WARNING_S": "600", **(extra or {})}
        procs, q = harness.start_ranks(n, looping, mode, str(tmp_path / "never"), env=env)
        started.append((procs, q))
        socks = {r: str(sdir / f"{p.pid}.sock") for r, p in enumerate(procs)}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            eps, _ = status.job_endpoints(list(socks.values()))
            if eps and all(os.path.exists(s) for s in socks.values()):
                v = status.job_view(eps[0]["addr"], eps[0]["comm"], bytes.fromhex(eps[0]["key"]), n)
                if all(e["state"] == "ok" and e["started"] > 0 for e in v["ranks"]):
                    return procs, socks, eps[0]
            time.sleep(0.2)
        raise AssertionError("ranks did not start looping within 60 s")

    yield start
    for procs, _ in started:
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            except (ProcessLookupError, AttributeError):
                pass
            p.join(5)


def tool(*args, env=None, timeout=30):
    e = dict(os.environ, PYTHONPATH=PY, **(env or {}))
    return subprocess.run([sys.executable, "-m", "harp.status", *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


def _state(view, rank):
    return view["ranks"][rank]["state"]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sigstopped_rank_named_from_two_hosts(job, n, tmp_path):
    procs, socks, ep = job(n)
    victim = n // 2  # on hostB (ranks n//2 ..) when n > 2
    os.kill(procs[victim].pid, signal.SIGSTOP)
    time.sleep(0.3)
    # From hostA: rank 0's local status socket hands out the endpoint and key.
    a = tool("--job", "--json", "--socket", socks[0])
    assert a.returncode == 0, a.stderr
    view = json.loads(a.stdout)["comms"][0]
    assert _state(view, victim) == "unreachable"
    assert view["analysis"]["unreachable"] == [victim] and victim in view["analysis"]["blame"]
    assert all(_state(view, r) == "ok" for r in range(n) if r != victim)
    assert all(e["hostid"] == ("hostA" if e["rank"] < n // 2 else "hostB") for e in view["ranks"] if e["state"] == "ok")
    # Links: eager tcp pairs of one lane, every one up (the stopped rank's too: nothing broke them).
    want = {k: ("tcp", c, c, {"1": c}) for k, c in (("same host", n // 2 - 1), ("other hosts", n // 2)) if c}
    for e in view["ranks"]:
        if e["state"] == "ok":
            assert {g["peers"]: (g["transport"], g["n"], g["up"], g["lanes"]) for g in e["links"]} == want, e
    # As from another host without a local rank: the address of the last live rank (on hostB when n > 2),
    # the key as --job-key printed it there.
    k = tool("--job-key", "--socket", socks[max(r for r in range(n) if r != victim)])
    comm_key, addr = k.stdout.split()[:2]
    b = tool("--job", "--rank-addr", addr, env={"HARP_JOBVIEW_KEY": comm_key})
    assert b.returncode == 0, b.stderr
    assert f"rank {victim:>4} pid {procs[victim].pid} on " in b.stdout and "UNREACHABLE" in b.stdout
    assert f"unreachable ranks (stopped, frozen or cut off): {victim}" in b.stdout
    assert f"to blame: {victim}" in b.stdout
    assert f"other hosts: tcp x{n // 2} [{n // 2} up ({n // 2} with 1 lane)]" in b.stdout
    if n > 2:
        assert f"links: same host: tcp x{n // 2 - 1} [{n // 2 - 1} up ({n // 2 - 1} with 1 lane)]; " in b.stdout
    if n == 4:  # the gathered flight records: the stopped rank gives none and is blamed
        d = tool("--job", "--json", "--dump", str(tmp_path / "dumps"), "--socket", socks[0])
        (res,) = json.loads(d.stdout)["dumps"]
        assert sorted(res["written"]) == [r for r in range(n) if r != victim] and list(res["no_record"]) == [str(victim)]
        (g,) = res["groups"].values()
        assert g["first"]["kind"] in ("unfinished", "stopped") and victim in g["first"]["blame"]


def test_killed_rank_shown_dead(job):
    procs, socks, ep = job(4)
    os.kill(procs[3].pid, signal.SIGKILL)
    procs[3].join(10)
    r = tool("--job", "--json", "--socket", socks[0])
    view = json.loads(r.stdout)["comms"][0]
    assert _state(view, 3) == "dead" and view["analysis"]["dead"] == [3]
    assert [_state(view, i) for i in range(3)] == ["ok"] * 3


def test_mismatched_collective_named_with_its_seq(job, tmp_path):
    procs, socks, ep = job(4, "mismatch")
    (tmp_path / "never").touch()  # every rank stops at the next agreement, then rank 3 broadcasts
    key = bytes.fromhex(ep["key"])
    # The view may name the mismatch while a rank's entry still shows an earlier call (seen under
    # load: last seqs {4180, 4181, 4183} for a mismatch at 4183, a rank's record a few calls behind
    # the calls its peers needed it for); the entries must converge on the mismatched call.
    deadline = time.monotonic() + 60
    m, seqs = None, set()
    while time.monotonic() < deadline:
        view = status.job_view(ep["addr"], ep["comm"], key, 4)
        m = view["analysis"]["mismatch"]
        seqs = {e["last"]["seq"] for e in view["ranks"]}
        if m and seqs == {m["seq"]}:
            break
        time.sleep(0.2)
    assert m, view
    assert seqs == {m["seq"]}, view  # the mismatched call is every rank's last
    assert m["by_collective"] == {"allreduce": [0, 1, 2], "broadcast": [3]} and m["blame"] == [3]
    text = tool("--job", "--socket", socks[1]).stdout
    assert f"collective mismatch at #{m['seq']}: allreduce on ranks 0, 1, 2; broadcast on ranks 3" in text
    # Every rank's flight record in one folder, and the first disagreement found in them.
    out = tmp_path / "dumps"
    d = tool("--job", "--json", "--dump", str(out), "--socket", socks[0])
    res = json.loads(d.stdout)["dumps"][0]
    assert res["written"] == [0, 1, 2, 3]
    assert sorted(os.listdir(out / ep["comm"])) == [f"harp_trace_rank_{r}" for r in range(4)]
    (first,) = [g["first"] for g in res["groups"].values()]
    assert first["kind"] == "mismatch" and first["seq"] == m["seq"] and first["blame"] == [3]


def test_no_key_or_wrong_key_is_refused(job, tmp_path):
    procs, socks, ep = job(2)
    # No local rank (an empty private status folder) and no HARP_JOBVIEW_KEY.
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    r = tool("--job", "--rank-addr", ep["addr"], env={"HARP_STATUS_DIR": str(empty), "HARP_JOBVIEW_KEY": ""})
    assert r.returncode == 2 and "HARP_JOBVIEW_KEY must be COMM:KEY" in r.stderr and r.stdout == ""
    wrong = ep["comm"] + ":" + os.urandom(32).hex()
    r = tool("--job", "--rank-addr", ep["addr"], env={"HARP_JOBVIEW_KEY": wrong})
    assert r.returncode == 2 and "PermissionError" in r.stderr and "refused" in r.stderr and r.stdout == ""
    with pytest.raises(PermissionError):
        status.job_request(ep["addr"], ep["comm"], os.urandom(32), "ADDRS", 1 << 20)
    # A comm id that does not live there: the same refusal (nothing tells the ids apart).
    with pytest.raises(PermissionError):
        status.job_request(ep["addr"], "%016x" % (int(ep["comm"], 16) ^ 1), bytes.fromhex(ep["key"]), "ADDRS", 1 << 20)
    # The right key still works afterwards.
    assert json.loads(status.job_request(ep["addr"], ep["comm"], bytes.fromhex(ep["key"]), "ADDRS", 1 << 20))["size"] == 2


def _raw(addr, data, wait=1.5):
    """Send bytes to the listener unauthenticated; everything it sends back before closing (or `wait`)."""
    host, port = status._hostport(addr)
    got = b""
    with socket.create_connection((host, port), timeout=wait) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while len(got) < 1 << 16:
                c = s.recv(4096)
                if not c:
                    break
                got += c
        except OSError:
            pass
    return got


@pytest.fixture(scope="module")
def one_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jv")
    sdir = tmp / "status"
    sdir.mkdir(mode=0o700)
    env = {"HARP_STATUS_DIR": str(sdir), "HARP_KEEPALIVE_TIMEOUT": "120", "HARP_TRANSPORT": "tcp"}
    procs, q = harness.start_ranks(2, looping, "hang", str(tmp / "never"), env=env)
    deadline = time.monotonic() + 60
    eps = []
    while time.monotonic() < deadline and not eps:
        time.sleep(0.2)
        eps, _ = status.job_endpoints([str(sdir / f"{p.pid}.sock") for p in procs])
    yield eps[0]
    for p in procs:
        p.kill()
        p.join(5)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=300), st.binary(max_size=60).map(lambda b: b"HJV1" + b)))
def test_unauthenticated_bytes_get_no_data(one_job, data):
    got = _raw(one_job["addr"], data)
    assert len(got) in (0, 64)  # nothing, or the handshake's nonce and proof: never an answer


def _authed(ep, body: bytes, declared=None):
    """An authenticated request with any body bytes (and optionally a false declared length)."""
    key, comm = bytes.fromhex(ep["key"]), ep["comm"]
    host, port = status._hostport(ep["addr"])
    with socket.create_connection((host, port), timeout=5) as s:
        na = os.urandom(32)
        s.sendall(b"HJV1" + struct.pack("<Q", int(comm, 16)) + na)
        got = status._recv_exact(s, 64, time.monotonic() + 5, "handshake")
        ctx = b"jobview|" + comm.encode()
        s.sendall(status._proof(key, b"A", got[:32], na, ctx) +
                  struct.pack("<I", len(body) if declared is None else declared) + body)
        try:
            (n,) = struct.unpack("<I", status._recv_exact(s, 4, time.monotonic() + 5, "answer"))
        except ConnectionError:
            return None
        return status._recv_exact(s, n, time.monotonic() + 5, "answer")


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.binary(max_size=200),
                 st.lists(st.integers(-3, 5), min_size=0, max_size=6).map(
                     lambda v: ("STATUS " + " ".join(map(str, v))).encode()),
                 st.text(alphabet="STATUS 0123456789-+ \t\n", max_size=40).map(str.encode)))
def test_malformed_requests_refused_with_a_reason(one_job, body):
    a = _authed(one_job, body)
    assert a is not None
    if body in (b"ADDRS", b"DUMP"):
        return
    parts = body.split(b" ")
    wellformed = (len(parts) == 5 and parts[0] == b"STATUS"
                  and all(re.fullmatch(rb"-?[0-9]{1,12}", p) for p in parts[1:]))
    if wellformed:
        root, lo, hi, ms = (int(p) for p in parts[1:])
        wellformed = (-1 <= root < 2 and 0 <= lo < hi <= 2 and (root >= 0 or lo == 0) and 1 <= ms <= 60000)
    if wellformed and ((root if root >= 0 else one_job["rank"]) + lo) % 2 == one_job["rank"]:
        entries = json.loads(b"[" + a + b"]")
        assert [e["rank"] for e in entries] == [(max(root, 0) + v) % 2 for v in range(lo, hi)] or root < 0
        assert all(e["state"] in ("ok", "unreachable", "not reached", "dead") for e in entries)
    else:
        assert json.loads(a)["error"]


def test_oversized_request_refused(one_job):
    a = _authed(one_job, b"", declared=1 << 20)  # claims a megabyte: refused before reading it
    assert "over 256 bytes" in json.loads(a)["error"]
    a = _authed(one_job, b"STATUS " + b"1" * 300)
    assert "over 256 bytes" in json.loads(a)["error"]
    assert json.loads(_authed(one_job, b"ADDRS"))["size"] == 2  # still answering


def metrics_rank(rank, size):
    """Rank 0 scrapes the job-wide gauges (and the per-process counters) while every rank is alive."""
    import numpy as np

    import harp
    import harp.metrics

    comm = harp.init(timeout=60)
    comm.allreduce(np.ones(8, np.float32))
    text = harp.metrics.generate(job=True) if rank == 0 else harp.metrics.generate()
    comm.barrier()
    return comm.rank, text


def test_prometheus_job_gauges_served_by_rank_0(tmp_path):
    sdir = tmp_path / "status"
    sdir.mkdir(mode=0o700)
    out = harness.run_ranks(3, metrics_rank, env={"HARP_STATUS_DIR": str(sdir), "HARP_TRANSPORT": "tcp"}, timeout=120)
    texts = dict(out)
    for r in range(3):
        assert "harp_collective_calls_total{" in texts[r]  # per-process metrics keep working
    assert re.search(r'harp_job_ranks\{comm="[0-9a-f]{16}",state="ok"\} 3\.0', texts[0])
    assert re.search(r'harp_job_ranks\{comm="[0-9a-f]{16}",state="dead"\} 0\.0', texts[0])
    assert "harp_job_view_seconds{" in texts[0]
    assert "harp_job_ranks" not in texts[1] and "harp_job_ranks" not in texts[2]


def test_ranks_sharing_a_process_answer_in_one_view(tmp_path, monkeypatch):
    """Three ranks as threads of this process and one more process: the tree serves the local ranks
    in-process (its own observer is busy with the request) and reaches the other process."""
    import threading

    import numpy as np

    import harp

    sdir = tmp_path / "status"
    sdir.mkdir(mode=0o700)
    monkeypatch.setenv("HARP_STATUS_DIR", str(sdir))
    monkeypatch.setenv("HARP_TRANSPORT", "tcp")
    uid = harp.get_unique_id("127.0.0.1:0")
    comms = [None] * 3

    def make(r):
        comms[r] = harp.Communicator(r, 4, uid, timeout=60)

    procs, q = harness.start_ranks(1, _fourth, uid.hex())
    ts = [threading.Thread(target=make, args=(r,)) for r in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    try:
        eps, _ = status.job_endpoints([harp._harp.obs_status_socket()])
        assert [(e["rank"], e["size"]) for e in eps] == [(0, 4)]
        v = status.job_view(eps[0]["addr"], eps[0]["comm"], bytes.fromhex(eps[0]["key"]), 4)
        assert [e["state"] for e in v["ranks"]] == ["ok"] * 4
        assert {e["pid"] for e in v["ranks"][:3]} == {os.getpid()} and v["ranks"][3]["pid"] == procs[0].pid
        # Children forked from a process with a listener open their own (the parent's stays the parent's).
        kids = harness.run_ranks(2, _forked_view, timeout=120)
        assert all(k[0] != eps[0]["addr"] for k in kids) and [s for s in kids[0][1]] == ["ok", "ok"]
        v = status.job_view(eps[0]["addr"], eps[0]["comm"], bytes.fromhex(eps[0]["key"]), 4)
        assert [e["state"] for e in v["ranks"]] == ["ok"] * 4
        ts = [threading.Thread(target=comms[r].allreduce, args=(np.ones(4, np.float32),)) for r in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    finally:
        for c in comms:
            if c is not None:
                c.destroy()
        procs[0].join(30)
        procs[0].kill()


def _fourth(rank, size, uid_hex):
    import numpy as np

    import harp

    c = harp.Communicator(3, 4, harp.UniqueId.from_hex(uid_hex), timeout=60)
    c.allreduce(np.ones(4, np.float32))
    c.destroy()


def _forked_view(rank, size):
    """A rank forked from a process that serves a job view: its own listener, its own view."""
    import harp

    comm = harp.init(timeout=60)
    (ep,) = status.job_endpoints([harp._harp.obs_status_socket()])[0]
    states = []
    if rank == 0:
        v = status.job_view(ep["addr"], ep["comm"], bytes.fromhex(ep["key"]), size)
        states = [e["state"] for e in v["ranks"]]
    comm.barrier()
    return ep["addr"], states


# --- links, and requests served side by side ---------------------------------------------------------------


def links_rank(rank, size, folder):
    """Lazy tcp pairs of 2 lanes on two faked hosts; only ranks 0 and 1 exchange a message; then wait."""
    import numpy as np

    import harp

    os.environ["HARP_HOSTID"] = "hostA" if rank < size // 2 else "hostB"
    comm = harp.init(timeout=120)
    x = np.ones(16, np.float32)
    if rank == 0:
        comm.send(x, 1)
    elif rank == 1:
        comm.recv(x, 0)
    open(os.path.join(folder, f"ready.{rank}"), "w").close()
    while not os.path.exists(os.path.join(folder, "stop")):
        time.sleep(0.1)
    comm.destroy()


def test_links_per_rank_lanes_and_lazy_pairs(tmp_path):
    """Every entry names its links: per peer class (faked hosts) and transport, the tcp pairs that are up with
    their lanes (HARP_SOCKET_NSTREAMS=2) and, with lazy set-up, the pairs not connected yet."""
    sdir = tmp_path / "status"
    sdir.mkdir(mode=0o700)
    env = {"HARP_STATUS_DIR": str(sdir), "HARP_TRANSPORT": "tcp", "HARP_SOCKET_CONNECT": "lazy",
           "HARP_SOCKET_NSTREAMS": "2"}
    procs, q = harness.start_ranks(4, links_rank, str(tmp_path), env=env)
    try:
        deadline = time.monotonic() + 60
        while sum(os.path.exists(tmp_path / f"ready.{r}") for r in range(4)) < 4:
            assert time.monotonic() < deadline, "ranks not ready in 60 s"
            time.sleep(0.2)
        socks = {r: str(sdir / f"{p.pid}.sock") for r, p in enumerate(procs)}
        (ep,), _ = status.job_endpoints([socks[0]])
        _check_links(ep, socks)
    finally:
        (tmp_path / "stop").touch()
        harness.collect(procs, q, timeout=60)


def _check_links(ep, socks):
    v = status.job_view(ep["addr"], ep["comm"], bytes.fromhex(ep["key"]), 4)
    links = {e["rank"]: {g["peers"]: g for g in e["links"]} for e in v["ranks"]}
    # Ranks 0 and 1 (hostA) exchanged a message: their pair is up with 2 lanes; nobody talked across hosts.
    for r in (0, 1):
        same, other = links[r]["same host"], links[r]["other hosts"]
        got = [(g["transport"], g["n"], g["up"], g["not_connected"], g["lanes"]) for g in (same, other)]
        assert got == [("tcp", 1, 1, 0, {"2": 1}), ("tcp", 2, 0, 2, {})], (r, links[r])
    for r in (2, 3):
        assert links[r]["same host"]["not_connected"] == 1 and links[r]["other hosts"]["not_connected"] == 2
        assert all(g["failed"] == 0 and g["up"] == 0 for g in links[r].values())
    text = tool("--job", "--socket", socks[0]).stdout
    assert "links: same host: tcp x1 [1 up (1 with 2 lanes)]; other hosts: tcp x2 [0 up; 2 not connected yet]" in text
    assert ("links: same host: tcp x1 [0 up; 1 not connected yet]; other hosts: tcp x2 [0 up; 2 not connected yet]"
            in text)


def _silent(addr, hello=b""):
    """A connection that sends `hello` (nothing, or part of one) and then nothing more, held open."""
    s = socket.create_connection(status._hostport(addr), timeout=5)
    if hello:
        s.sendall(hello)
    return s


def _open(s):
    """True while the rank keeps the connection open (nothing to read, no EOF)."""
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


@pytest.fixture
def slow_job(job):
    """4 ranks whose handshake deadline is long (HARP_JOBVIEW_HOP_S=2: a rank waits 4 s for a client's
    handshake, a parent 2 s for a child's): one connection served at a time would hold every other for that
    long, past the deadlines the tests give."""
    return job(4, extra={"HARP_JOBVIEW_HOP_S": "2"})


def test_silent_connections_do_not_delay_an_honest_view(slow_job):
    procs, socks, ep = slow_job
    key = bytes.fromhex(ep["key"])
    # Unauthenticated clients that connect and send nothing, or half a hello, and stay.
    silent = [_silent(ep["addr"]) for _ in range(6)] + [_silent(ep["addr"], b"HJV1\x00")]
    try:
        time.sleep(0.2)
        t = time.monotonic()
        # The honest tool's handshake must finish in 2 s (job_request's hop), under the 4 s each silent one
        # may hold the rank's handshake.
        v = status.job_view(ep["addr"], ep["comm"], key, 4, timeout=3.0)
        took = time.monotonic() - t
        assert [e["state"] for e in v["ranks"]] == ["ok"] * 4, (took, v["ranks"])
        assert all(_open(s) for s in silent)  # they were still held, not refused
        # The command, from another rank's socket, while fresh silent connections are held at rank 1.
        addr1 = json.loads(status.job_request(ep["addr"], ep["comm"], key, "ADDRS", 1 << 20))["addrs"][1]
        silent += [_silent(addr1) for _ in range(4)]
        r = tool("--job", "--json", "--socket", socks[1])
        assert r.returncode == 0, r.stderr
        assert [e["state"] for e in json.loads(r.stdout)["comms"][0]["ranks"]] == ["ok"] * 4
        assert all(_open(s) for s in silent[-4:]) or time.monotonic() - t > 3.5  # held unless past their deadline
    finally:
        for s in silent:
            s.close()


def test_handshakes_waiting_are_bounded_oldest_dropped(slow_job):
    procs, socks, ep = slow_job
    silent = [_silent(ep["addr"]) for _ in range(70)]  # more than the 64 handshakes a rank keeps waiting
    try:
        time.sleep(0.5)
        v = status.job_view(ep["addr"], ep["comm"], bytes.fromhex(ep["key"]), 4, timeout=3.0)
        assert [e["state"] for e in v["ranks"]] == ["ok"] * 4
        held = [_open(s) for s in silent]
        # The first ones made room (closed by the rank, 7 of them with the honest client's); the newest stay.
        assert not any(held[:6]) and all(held[-50:]), held
    finally:
        for s in silent:
            s.close()


def test_two_views_at_once_both_answered(slow_job):
    """Two tools at once, each rooted at another rank, while one rank is stopped: each view waits 2 s for the
    stopped rank's handshake, so each root is serving its own view when the other's fan-out hop arrives. Both
    are answered, every live rank "ok" in both (a rank serving one view at a time would be unreachable in the
    other)."""
    import threading

    procs, socks, ep = slow_job
    key = bytes.fromhex(ep["key"])
    os.kill(procs[3].pid, signal.SIGSTOP)
    addrs = json.loads(status.job_request(ep["addr"], ep["comm"], key, "ADDRS", 1 << 20))["addrs"]
    out = {}

    def view(r):
        t = time.monotonic()
        out[r] = (status.job_view(addrs[r], ep["comm"], key, 4, timeout=6.0), time.monotonic() - t)

    ts = [threading.Thread(target=view, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    for r in (0, 1):
        v, took = out[r]
        assert [e["state"] for e in v["ranks"]] == ["ok", "ok", "ok", "unreachable"], (r, took, v["ranks"])
        assert v["analysis"]["blame"] == [3]


def test_sessions_at_once_are_bounded(slow_job):
    """More requests at once than a rank serves (8): each waits 2 s on the stopped rank, so they overlap; the
    ones over the bound get "busy" at once, the others their answer."""
    import threading

    procs, socks, ep = slow_job
    key = bytes.fromhex(ep["key"])
    os.kill(procs[3].pid, signal.SIGSTOP)
    got = []

    def ask():
        t = time.monotonic()
        a = status.job_request(ep["addr"], ep["comm"], key, "STATUS -1 0 4 5000", 4 * status.ENTRY_CAP + 64, 8.0)
        got.append((a, time.monotonic() - t))

    ts = [threading.Thread(target=ask) for _ in range(11)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    busy = [a for a, _ in got if a.startswith(b'{"error":"busy')]
    full = [json.loads(b"[" + a + b"]") for a, _ in got if not a.startswith(b'{"error"')]
    assert len(got) == 11 and len(busy) == 3 and len(full) == 8, [a[:80] for a, _ in got]
    assert all([e["state"] for e in f] == ["ok", "ok", "ok", "unreachable"] for f in full)
