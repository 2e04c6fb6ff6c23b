"""Security of the bootstrap (rendezvous side): the store's parser,
its authentication, its listener under a connection flood, timeouts, start-up
diagnostics, one communicator per unique id, and leaks.

Servers and ranks run as subprocesses, so a crash shows up as a dead process
and a rank's stderr can be read. The store's wire format is in bootstrap/store.cc;
this file speaks it with a small Python client (StoreClient).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harp
from harp._env import secret_key

PY = sys.executable
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
TRANSPORTS = ["tcp", "shm"]
MAX_KEY, MAX_VALUE = 4096, 64 << 20

# ----------------------------------------------------------------------------- helpers


SERVER_PROG = textwrap.dedent("""
    import resource, sys
    lim = int(sys.argv[1])
    if lim:
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    import harp
    u = harp.get_unique_id("127.0.0.1:0")
    print(u.hex(), flush=True)
    sys.stdin.read()
""")

RANK_PROG = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import harp
    spec = json.loads(sys.argv[1])
    t0 = time.monotonic()
    try:
        if spec.get("init"):
            c = harp.init()
        else:
            c = harp.Communicator(spec["rank"], spec["size"], harp.UniqueId.from_hex(spec["uid"]))
        x = np.full(7, float(c.rank + 1))
        c.allreduce(x)
        out = {"ok": True, "sum": float(x[0]), "transport": c.transport((c.rank + 1) % c.size)}
        if spec.get("twice"):
            try:
                harp.init() if spec.get("init") else harp.Communicator(
                    spec["rank"], spec["size"], harp.UniqueId.from_hex(spec["uid"]))
                out["second"] = "no error"
            except Exception as e:
                out["second"] = type(e).__name__ + ": " + str(e)
        if spec.get("hold"):
            print("FORMED", flush=True)
            sys.stdin.read()
        c.destroy()
    except Exception as e:
        out = {"ok": False, "cls": type(e).__name__, "msg": str(e)}
    out["secs"] = time.monotonic() - t0
    print("RESULT " + json.dumps(out), flush=True)
""")


class Server:
    """A bootstrap store served by a subprocess (get_unique_id there)."""

    def __init__(self, nofile=0):
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen([PY, "-c", SERVER_PROG, str(nofile)], env=ENV, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.uid = self.p.stdout.readline().strip()
        assert len(self.uid) == 256, self.stderr()
        b = bytes.fromhex(self.uid)
        self.addr = (socket.inet_ntoa(b[12:16]), int.from_bytes(b[10:12], "little"))
        self.secret = b[28:60]

    def alive(self):
        return self.p.poll() is None

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def cpu_seconds(self):
        with open(f"/proc/{self.p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self):
        if self.alive():
            self.p.stdin.close()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _proof(key, role, challenge, own, ctx=b"harp-store"):
    return hmac.new(key, b"HARP-AUTH1" + role + challenge + own + ctx, hashlib.sha256).digest()


def _recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


class StoreClient:
    """The store protocol of bootstrap/store.cc, in Python."""

    def __init__(self, addr, secret, timeout=30):
        self.key = hmac.new(secret, b"HARP-KEY1|store", hashlib.sha256).digest()
        self.s = socket.create_connection(addr, timeout=timeout)

    def hello(self, na=None, proof=None):
        """The client proves first: (accepted, (na, the client's proof))."""
        self.na = na or os.urandom(32)
        self.s.sendall(b"HARPSTR3" + self.na)
        self.nb = _recv_exact(self.s, 32)
        return self.answer(proof)

    def answer(self, proof=None):
        mine = proof if proof is not None else _proof(self.key, b"A", self.nb, self.na)
        try:
            self.s.sendall(mine)
            verdict = self.s.recv(1)
        except OSError:
            return False, (self.na, mine)
        if verdict == b"\x01":
            mac = _recv_exact(self.s, 32)
            assert hmac.compare_digest(mac, _proof(self.key, b"B", self.na, self.nb)), "server proof wrong"
        return verdict == b"\x01", (self.na, mine)

    def frame(self, cmd, key, value):
        self.s.sendall(struct.pack("<BI", cmd, len(key)) + key + struct.pack("<I", len(value)) + value)

    def set(self, key, value):
        self.frame(1, key, value)
        assert _recv_exact(self.s, 1) == b"\x01"

    def get(self, key, timeout_ms=10000):
        self.frame(2, key, struct.pack("<I", timeout_ms))
        if _recv_exact(self.s, 1) == b"\x00":
            return None
        (n,) = struct.unpack("<I", _recv_exact(self.s, 4))
        return _recv_exact(self.s, n)

    def check(self, keys):
        self.frame(4, b"", struct.pack("<I", len(keys)) + b"".join(struct.pack("<I", len(k)) + k for k in keys))
        (n,) = struct.unpack("<I", _recv_exact(self.s, 4))
        return list(_recv_exact(self.s, n))

    def closed_by_server(self, wait=10):
        """Drain until the server closes the connection (True) or `wait` s pass (False)."""
        self.s.settimeout(wait)
        try:
            while self.s.recv(65536):
                pass
            return True
        except (socket.timeout, TimeoutError):
            return False
        except OSError:
            return True

    def close(self):
        self.s.close()


def assert_serves(srv):
    """The server process is alive and answers a legitimate client."""
    assert srv.alive(), "store server died:\n" + srv.stderr()
    c = StoreClient(srv.addr, srv.secret)
    ok, _ = c.hello()
    assert ok
    v = os.urandom(5)
    c.set(b"probe", v)
    assert c.get(b"probe") == v
    c.close()


def launch(spec, env=None):
    return subprocess.Popen([PY, "-c", RANK_PROG, json.dumps(spec)], env=dict(ENV, **(env or {})),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert lines, f"no result (rc {p.returncode}):\n{out}\n{err}"
    r = json.loads(lines[-1][7:])
    r["stderr"] = err
    return r


def run_job(specs, env=None, timeout=120):
    procs = [launch(s, env) for s in specs]
    return [result(p, timeout) for p in procs]


# ----------------------------------------------------------------------------- 2. parser


def test_wrapping_key_length_does_not_crash_the_store(server):
    c = StoreClient(server.addr, server.secret)
    assert c.hello()[0]
    # The original finding: klen = 0xFFFFFFF7 made 5 + klen + 4 wrap in 32 bits.
    c.s.sendall(struct.pack("<BI", 1, 0xFFFFFFF7) + b"x" * 64)
    assert c.closed_by_server()
    assert_serves(server)


@pytest.mark.parametrize("klen,vlen", [(MAX_KEY + 1, 1), (1, MAX_VALUE + 1), (0xFFFFFFFF, 0), (3, 0xFFFFFFFF)])
def test_lengths_over_the_limits_disconnect_at_once(server, klen, vlen):
    c = StoreClient(server.addr, server.secret)
    assert c.hello()[0]
    key = b"k" * min(klen, 8192)
    c.s.sendall(struct.pack("<BI", 1, klen) + (key + struct.pack("<I", vlen) if klen <= MAX_KEY else b""))
    assert c.closed_by_server()  # without waiting for the (huge) rest
    assert_serves(server)


def test_unknown_command_disconnects(server):
    c = StoreClient(server.addr, server.secret)
    assert c.hello()[0]
    c.frame(99, b"k", b"v")
    assert c.closed_by_server()
    assert_serves(server)


@pytest.fixture(scope="module")
def fuzz_server():
    s = Server()
    yield s
    s.close()


_len = st.one_of(st.integers(0, 64), st.sampled_from([MAX_KEY, MAX_KEY + 1, MAX_VALUE, MAX_VALUE + 1]),
                 st.integers(0, 2**32 - 1))


# Every command but FORMED (7): an authenticated client that says a communicator formed ends the
# store's service once its clients are gone, by design (test_formed_store_stops_once_its_clients_leave).
_cmd = st.integers(0, 255).filter(lambda c: c != 7)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(st.tuples(_cmd, _len, _len, st.binary(max_size=96)), min_size=1, max_size=4),
       tail=st.binary(max_size=64))
def test_fuzzed_frames_never_break_the_store(fuzz_server, frames, tail):
    """Random commands and length fields (including wrapping and over-limit ones) from an
    authenticated client: the server drops or answers it, and keeps serving others."""
    c = StoreClient(fuzz_server.addr, fuzz_server.secret)
    assert c.hello()[0]
    data = b""
    for cmd, klen, vlen, payload in frames:
        data += struct.pack("<BI", cmd, klen) + payload[:klen] + struct.pack("<I", vlen) + payload[:vlen]
    try:
        c.s.sendall(data + tail)
    except OSError:
        pass  # dropped mid-send: fine
    c.closed_by_server(wait=0.2)
    c.close()
    assert_serves(fuzz_server)


def test_formed_store_stops_once_its_clients_leave(server):
    """FORMED (command 7) from an authenticated client: the store keeps serving the clients it has,
    and stops listening once the last one is gone (the fuzz tests above leave this command out)."""
    a, b = StoreClient(server.addr, server.secret), StoreClient(server.addr, server.secret)
    assert a.hello()[0] and b.hello()[0]
    a.frame(7, b"", b"")
    a.close()
    b.set(b"k", b"v")
    assert b.get(b"k") == b"v"  # still serving the client it has
    b.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(server.addr, timeout=1).close()
        except ConnectionRefusedError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the store still listens after FORMED and its last client left")
    assert server.alive()  # the process lives on; only its store stopped


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(hello=st.one_of(st.binary(max_size=200), st.binary(max_size=100).map(lambda b: b"HARPSTR3" + b)))
def test_fuzzed_hellos_are_refused(fuzz_server, hello):
    s = socket.create_connection(fuzz_server.addr, timeout=10)
    try:
        s.sendall(hello)
        s.settimeout(0.2)
        got = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except (socket.timeout, TimeoutError, OSError):
            pass
        # At most the server's nonce (32 B) and a refusal; never the ack of an authenticated client.
        assert len(got) in (0, 32) or (len(got) == 33 and got[32:] == b"\x00"), got
    finally:
        s.close()
    assert_serves(fuzz_server)


def _fake_root(secret, reply_get):
    """A store root that knows `secret` and answers GET with `reply_get` bytes."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)
    key = hmac.new(secret, b"HARP-KEY1|store", hashlib.sha256).digest()

    def serve():
        try:
            c, _ = ls.accept()
            c.settimeout(30)
            na = _recv_exact(c, 40)[8:]
            nb = os.urandom(32)
            c.sendall(nb)
            _recv_exact(c, 32)  # accepted unchecked: what matters is the client's check of the proof below
            c.sendall(b"\x01" + _proof(key, b"B", na, nb))
            while True:
                cmd, klen = struct.unpack("<BI", _recv_exact(c, 5))
                _recv_exact(c, klen)
                (vlen,) = struct.unpack("<I", _recv_exact(c, 4))
                _recv_exact(c, vlen)
                c.sendall(struct.pack("<q", 1) if cmd == 3 else reply_get if cmd == 2 else b"\x01")
        except Exception:  # noqa: BLE001 - the client hung up
            pass

    threading.Thread(target=serve, daemon=True).start()
    return ls


def test_client_bounds_the_value_length_the_root_sends():
    secret = os.urandom(32)
    ls = _fake_root(secret, b"\x01" + struct.pack("<I", 0xFFFFFFFF))
    uid = harp.UniqueId(harp._harp.make_unique_id("127.0.0.1:%d" % ls.getsockname()[1], secret))
    with pytest.raises(harp.PeerError, match="4294967295 bytes"):
        harp.Communicator(0, 1, uid, timeout=20)
    ls.close()


# ----------------------------------------------------------------------------- 1. secrets and the hello


@pytest.mark.parametrize("launch_vars", [{"HARP_ADDR": "127.0.0.1:29999", "HARP_RANK": "0", "HARP_WORLD_SIZE": "2"},
                                         {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998", "RANK": "1",
                                          "WORLD_SIZE": "2"},
                                         {"HARP_ADDR": "127.0.0.1:29997", "SLURM_PROCID": "0", "SLURM_NTASKS": "3",
                                          "SLURM_JOB_ID": "42"}])
def test_address_launch_without_secret_refuses_to_start(launch_vars):
    with pytest.raises(harp.InvalidArgumentError, match="HARP_SECRET") as e:
        harp.init(env=launch_vars)
    assert "secrets.token_hex" in str(e.value)


def test_unique_ids_carry_random_secrets():
    a, b = harp.get_unique_id("127.0.0.1:0"), harp.get_unique_id("127.0.0.1:0")
    assert a.bytes[28:60] != b.bytes[28:60]
    assert len(set(a.bytes[28:60])) > 8  # not a constant or empty secret
    a.release(), b.release()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_address_launch_with_secret_forms_a_job(transport):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"HARP_ADDR": f"127.0.0.1:{port}", "HARP_SECRET": os.urandom(16).hex(), "HARP_WORLD_SIZE": "3",
           "HARP_TRANSPORT": transport}
    procs = [launch({"init": True}, dict(env, HARP_RANK=str(r))) for r in range(3)]
    res = [result(p) for p in procs]
    assert all(r["ok"] and r["sum"] == 6.0 and r["transport"] == transport for r in res), res


def test_recorded_hello_cannot_be_replayed(server):
    c = StoreClient(server.addr, server.secret)
    ok, (na, proof) = c.hello()
    assert ok
    c.close()
    # An eavesdropper replays the client's messages; the server's fresh nonce makes the old proof wrong.
    spy = StoreClient(server.addr, os.urandom(32))
    spy.s.sendall(b"HARPSTR3" + na)
    _recv_exact(spy.s, 32)
    spy.s.sendall(proof)
    assert spy.s.recv(1) == b"\x00"
    assert spy.closed_by_server()
    assert "refused bootstrap connection" in server.stderr()
    assert_serves(server)


def test_client_does_not_trust_a_root_without_the_secret():
    ls = _fake_root(os.urandom(32), b"\x00")  # a root that does not know the job's secret
    uid = harp.UniqueId(harp._harp.make_unique_id("127.0.0.1:%d" % ls.getsockname()[1], os.urandom(32)))
    with pytest.raises(harp.PeerError, match="did not prove knowledge of this job's secret"):
        harp.Communicator(0, 1, uid, timeout=20)
    ls.close()


# ----------------------------------------------------------------------------- 5. listener flood


def test_idle_connection_flood_neither_blocks_a_job_nor_spins_the_root():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048 and hard >= 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    srv = Server(nofile=128)  # the root runs out of descriptors long before the flood ends
    idle = []
    try:
        for _ in range(1100):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(srv.addr)
                idle.append(s)
            except OSError:
                s.close()
        assert len(idle) > 500
        cpu0 = srv.cpu_seconds()
        time.sleep(3)
        busy = srv.cpu_seconds() - cpu0
        assert busy < 1.5, f"root used {busy:.2f} s of CPU in 3 s of idle connections (spinning?)"
        res = run_job([{"rank": r, "size": 3, "uid": srv.uid} for r in range(3)], {"HARP_TRANSPORT": "tcp"})
        assert all(r["ok"] and r["sum"] == 6.0 for r in res), res
        assert srv.alive()
        assert srv.stderr().count("accept failed") == 1  # the root did run out of fds, and logged it once
    finally:
        for s in idle:
            s.close()
        srv.close()


# ----------------------------------------------------------------------------- connection flood during init

FLOOD_PROG = textwrap.dedent("""
    import os, resource, socket, sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    host, port, keep, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    # Silent connections and partial hellos (the magic, or the magic and half a nonce), opened as
    # fast as this process can, the oldest closed to stay under `keep` descriptors.
    kinds = [b"", b"HARPSTR", b"HARPSTR3" + os.urandom(16)]
    open_, n = [], 0
    while True:
        s = socket.socket()
        s.bind((source, 0))
        s.setblocking(False)
        try:
            s.connect((host, port))
        except BlockingIOError:
            pass
        open_.append((s, kinds[n % len(kinds)]))
        n += 1
        if len(open_) > 4 and open_[-4][1]:
            try:
                open_[-4][0].send(open_[-4][1])
            except OSError:
                pass
        if len(open_) > keep:
            open_.pop(0)[0].close()
        if n == keep:
            print("FLOODING", flush=True)
""")


class Flood:
    """`n` flooder processes against `addr`, from the loopback address `source`."""

    def __init__(self, addr, n=2, keep=1500, source="127.0.0.1"):
        self.procs = [subprocess.Popen([PY, "-c", FLOOD_PROG, addr[0], str(addr[1]), str(keep), source], env=ENV,
                                       stdout=subprocess.PIPE, text=True) for _ in range(n)]
        for p in self.procs:
            assert p.stdout.readline().strip() == "FLOODING"

    def running(self):
        return all(p.poll() is None for p in self.procs)

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


class Proxy:
    """A TCP relay in front of the store, standing in for ranks far away or shed under load: it
    holds each client's second message (its answer to the challenge) back `delay` seconds, and
    closes the first `drop` connections after reading their first message."""

    def __init__(self, target, delay=0.0, drop=0):
        self.target, self.delay, self.drop = target, delay, drop
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def uid(self, secret):
        return harp._harp.make_unique_id(f"127.0.0.1:{self.port}", secret).hex()

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._relay, args=(c, self.accepted <= self.drop), daemon=True).start()

    @staticmethod
    def _pump(a, b, hold=0.0, first=0):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                if first > 0:
                    time.sleep(hold)
                    first -= len(d)
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _relay(self, c, drop):
        try:
            hello = _recv_exact(c, 40)
        except (OSError, ConnectionError):
            return c.close()
        if drop:
            return c.close()
        u = socket.create_connection(self.target)
        u.sendall(hello)
        threading.Thread(target=self._pump, args=(u, c), daemon=True).start()
        self._pump(c, u, self.delay, 1)

    def close(self):
        self.ls.close()


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_connection_flood_does_not_lock_ranks_out_of_the_store(server, delay):
    """An outsider opens silent connections and partial hellos as fast as it can, on the ranks'
    own loopback address: every rank still gets in and the communicator forms within seconds,
    also ranks that take `delay` seconds to answer the store's challenge (as if far away)."""
    proxy = Proxy(server.addr, delay=delay)
    flood = Flood(server.addr)
    try:
        res = run_job([{"rank": r, "size": 4, "uid": proxy.uid(server.secret)} for r in range(4)],
                      {"HARP_TRANSPORT": "tcp", "HARP_TIMEOUT": "60"}, timeout=120)
        assert flood.running(), "a flooder stopped early"
    finally:
        flood.stop()
        proxy.close()
    assert all(r["ok"] and r["sum"] == 10.0 for r in res), res
    assert max(r["secs"] for r in res) < 20, [r["secs"] for r in res]
    assert server.alive()


def test_store_client_redials_a_hello_dropped_before_the_challenge(server):
    """A store under load may shed a connection before it answers the hello: the client dials
    again instead of reporting a wrong id or secret."""
    proxy = Proxy(server.addr, drop=3)
    try:
        res = run_job([{"rank": r, "size": 2, "uid": proxy.uid(server.secret)} for r in range(2)],
                      {"HARP_TIMEOUT": "30"}, timeout=60)
    finally:
        proxy.close()
    assert all(r["ok"] and r["sum"] == 3.0 for r in res), res
    assert proxy.accepted >= 5


def _challenged(c):
    """Send the first hello message on StoreClient c and read the store's answer to it."""
    c.na = os.urandom(32)
    c.s.sendall(b"HARPSTR3" + c.na)
    c.nb = _recv_exact(c.s, 32)


def _answer(c):
    """Finish c's hello: True when the store accepted it, False when it hung up."""
    return c.answer()[0]


def _open(addr, n, source, data=b""):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(addr)
        if data:
            s.sendall(data)
        socks.append(s)
    return socks


@pytest.mark.parametrize("flood_source,flood_data", [("127.0.0.1", b""), ("127.0.0.1", b"HARPSTR"),
                                                     ("127.0.0.2", b"first")])
def test_pending_hello_survives_a_burst_of_connections(server, flood_source, flood_data):
    """A client in the middle of its hello is not dropped for newer connections that are silent or
    partial (from any address), nor for hellos from another address ("first": complete first
    messages, waiting for their challenge answer like the client itself)."""
    honest = StoreClient(server.addr, server.secret)
    _challenged(honest)
    if flood_data == b"first":
        flood = []
        for _ in range(300):  # more than the store holds pending: it sheds some of these
            f = StoreClient(server.addr, os.urandom(32))
            f.s.close()
            f.s = _open(server.addr, 1, flood_source)[0]
            flood.append(f.s)
            try:
                _challenged(f)
            except ConnectionError:
                pass
    else:
        flood = _open(server.addr, 300, flood_source, flood_data)
        sync = StoreClient(server.addr, server.secret)  # answered: the store has accepted the 300 before it
        _challenged(sync)
        flood.append(sync.s)
    try:
        assert _answer(honest), "the store dropped a client in the middle of its hello"
    finally:
        for s in flood:
            s.close()
    assert_serves(server)


def test_unauthenticated_connection_is_dropped_after_the_hello_deadline(server):
    s = socket.create_connection(server.addr, timeout=60)
    s.sendall(b"HARPSTR3")  # a partial hello, then silence
    assert s.recv(1) == b""  # the root hangs up (after ~5 s), it does not wait forever
    s.close()
    assert_serves(server)


# ----------------------------------------------------------------------------- 8. timeouts


@pytest.mark.parametrize("value", ["inf", "1e13", "1e300"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_huge_timeouts_mean_no_timeout(value, transport):
    uid = harp.get_unique_id("127.0.0.1:0")
    res = run_job([{"rank": r, "size": 3, "uid": uid.hex()} for r in range(3)],
                  {"HARP_TIMEOUT": value, "HARP_TRANSPORT": transport})
    assert all(r["ok"] and r["sum"] == 6.0 for r in res), res


def test_huge_timeout_still_reports_rendezvous_errors_without_negative_seconds():
    uid = harp.get_unique_id("127.0.0.1:0")
    specs = [{"rank": 0, "size": 2, "uid": uid.hex()}, {"rank": 1, "size": 3, "uid": uid.hex()}]
    res = run_job(specs, {"HARP_TIMEOUT": "inf"})
    for r in res:
        assert not r["ok"] and "world size 3 here" in r["msg"] and "vs 2 at rank 0" in r["msg"], r
        assert "-2147483648" not in r["msg"] and "timed out" not in r["msg"], r


@pytest.mark.parametrize("value", ["-1", "0", "nan", "abc", "-inf", "1e-400x"])
def test_bad_timeouts_are_invalid_arguments_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("HARP_TIMEOUT", value)
    uid = harp.get_unique_id("127.0.0.1:0")
    with pytest.raises(harp.InvalidArgumentError, match="HARP_TIMEOUT"):
        harp.Communicator(0, 1, uid)
    uid.release()


@given(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not (x > 0)))
@settings(max_examples=30, deadline=None)
def test_bad_timeout_arguments_are_refused(x):
    uid = harp.get_unique_id("127.0.0.1:0")
    try:
        if x < 0:
            return  # negative = "use HARP_TIMEOUT", documented
        with pytest.raises(harp.InvalidArgumentError, match="timeout"):
            harp.Communicator(0, 1, uid, timeout=x)
    finally:
        uid.release()


# ----------------------------------------------------------------------------- 14 + 9. rendezvous diagnostics


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_duplicate_rank_is_reported_on_every_rank(transport):
    uid = harp.get_unique_id("127.0.0.1:0")
    specs = [{"rank": r, "size": 3, "uid": uid.hex()} for r in (0, 1, 1)]
    res = run_job(specs, {"HARP_TRANSPORT": transport})
    for r in res:
        assert not r["ok"] and "duplicate rank 1" in r["msg"], res


def test_duplicate_rank_zero_on_an_address_launch_is_not_address_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "dup-test-" + os.urandom(8).hex()
    env = {"HARP_ADDR": f"127.0.0.1:{port}", "HARP_SECRET": secret, "HARP_WORLD_SIZE": "2"}
    first = launch({"init": True}, dict(env, HARP_RANK="0"))
    # Wait (by polling the store, not the clock) until the first rank 0 serves and has checked in.
    spy = None
    while spy is None:
        assert first.poll() is None
        try:
            spy = StoreClient(("127.0.0.1", port), secret_key(secret))
            assert spy.hello()[0]
        except OSError:
            spy = None
            time.sleep(0.05)
    while spy.check([b"c/claim/0"]) != [1]:
        time.sleep(0.05)
    second = result(launch({"init": True}, dict(env, HARP_RANK="0")))
    # (rank 1 is left out: the store lives in the first rank 0, which exits on the error.)
    res = [second, result(first)]
    for r in res:
        assert not r["ok"] and "duplicate rank 0" in r["msg"] and "in use" not in r["msg"], res


def test_world_size_mismatch_names_both_sizes():
    uid = harp.get_unique_id("127.0.0.1:0")
    specs = [{"rank": 0, "size": 3, "uid": uid.hex()}, {"rank": 1, "size": 3, "uid": uid.hex()},
             {"rank": 2, "size": 4, "uid": uid.hex()}]
    res = run_job(specs)
    for r in res:
        assert not r["ok"] and "world size 4 here" in r["msg"] and "vs 3 at rank 0" in r["msg"], res


@pytest.mark.parametrize("bad", [5, 3, -1])
def test_rank_out_of_range_is_reported_on_every_rank(bad):
    uid = harp.get_unique_id("127.0.0.1:0")
    specs = [{"rank": 0, "size": 3, "uid": uid.hex()}, {"rank": 1, "size": 3, "uid": uid.hex()},
             {"rank": bad, "size": 3, "uid": uid.hex()}]
    res = run_job(specs)
    assert res[2]["cls"] == "InvalidArgumentError", res
    for r in res:
        assert not r["ok"] and f"rank {bad} " in r["msg"] and "out of range for world size 3" in r["msg"], res


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rank_that_dies_during_rendezvous_is_named_within_the_timeout(transport, server):
    env = {"HARP_TRANSPORT": transport, "HARP_TIMEOUT": "120"}
    victim = launch({"rank": 2, "size": 3, "uid": server.uid}, env)
    spy = StoreClient(server.addr, server.secret)
    assert spy.hello()[0]
    while spy.check([b"c/claim/2"]) != [1]:  # until rank 2 has checked in
        assert victim.poll() is None
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    res = run_job([{"rank": r, "size": 3, "uid": server.uid} for r in (0, 1)], env)
    for r in res:
        assert not r["ok"] and r["cls"] == "PeerError" and "rank 2 (pid" in r["msg"], res
        assert r["secs"] < 100  # decided by the closed connection, not by the 120 s timeout


def test_waiting_ranks_print_progress_naming_the_missing_ones():
    uid = harp.get_unique_id("127.0.0.1:0")
    res = run_job([{"rank": r, "size": 4, "uid": uid.hex()} for r in (0, 2)], {"HARP_TIMEOUT": "12"})
    assert all(not r["ok"] and r["cls"] == "HarpTimeoutError" for r in res), res
    assert all("1, 3" in r["msg"] for r in res), res
    assert "harp: rendezvous: waiting for ranks 1, 3 (2 of 4 missing)" in res[0]["stderr"], res[0]["stderr"]


# ----------------------------------------------------------------------------- 10. one id, one communicator


def test_init_twice_in_one_process_is_refused():
    uid = harp.get_unique_id("127.0.0.1:0")
    res = run_job([{"init": True, "twice": True}], {"HARP_UNIQUE_ID": uid.hex(), "HARP_RANK": "0",
                                                    "HARP_WORLD_SIZE": "1"})
    assert res[0]["ok"] and "InvalidArgumentError" in res[0]["second"] and "one communicator" in res[0]["second"]


def test_second_communicator_on_a_used_id_is_refused_across_processes(server):
    holders = [launch({"rank": r, "size": 2, "uid": server.uid, "hold": True}) for r in range(2)]
    for h in holders:
        assert h.stdout.readline().strip() == "FORMED"
    late = result(launch({"rank": 0, "size": 2, "uid": server.uid}), timeout=60)
    assert not late["ok"] and late["cls"] == "InvalidArgumentError" and "one communicator" in late["msg"], late
    for h in holders:
        r = result(h)
        assert r["ok"], r


# ----------------------------------------------------------------------------- 11. leaks

LEAK_PROG = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import harp
    def fds(): return len(os.listdir("/proc/self/fd"))
    def threads(): return len(os.listdir("/proc/self/task"))
    def settle():
        end = time.monotonic() + 60
        while harp._harp.store_servers_running() and time.monotonic() < end:
            time.sleep(0.05)
        return harp._harp.store_servers_running()
    def cycle():
        u = harp.get_unique_id("127.0.0.1:0")
        c = harp.Communicator(0, 1, u)
        x = np.ones(3); c.allreduce(x); c.destroy()
    cycle(); settle()
    f0, t0 = fds(), threads()
    for _ in range(20):
        cycle()
    left = settle()
    print("FORMED", left, fds() - f0, threads() - t0)
    ids = [harp.get_unique_id("127.0.0.1:0") for _ in range(10)]
    running = harp._harp.store_servers_running()
    for u in ids: u.release()
    print("UNUSED", running, harp._harp.store_servers_running(), fds() - f0, threads() - t0)
    # destroy() closes the store connection at once (the root is another process here)
    remote = harp.UniqueId.from_hex(sys.argv[1])
    f1 = fds()
    c = harp.Communicator(0, 1, remote)
    c.destroy()
    print("DESTROY", fds() - f1)
""")


def test_unique_ids_and_communicators_do_not_leak(server):
    out = subprocess.run([PY, "-c", LEAK_PROG, server.uid], env=ENV, capture_output=True, text=True, timeout=300)
    lines = {l.split()[0]: [int(x) for x in l.split()[1:]] for l in out.stdout.splitlines() if l[:1].isupper()}
    assert lines.get("FORMED") == [0, 0, 0], out
    assert lines.get("UNUSED") == [10, 0, 0, 0], out
    assert lines.get("DESTROY") == [0], out


DROP_PROG = textwrap.dedent("""
    import gc, os, sys, time
    import harp
    def fds(): return len(os.listdir("/proc/self/fd"))
    def threads(): return len(os.listdir("/proc/self/task"))
    f0, t0 = fds(), threads()
    ids = [harp.get_unique_id("127.0.0.1:0") for _ in range(200)]
    print("HELD", fds() - f0, threads() - t0, harp._harp.store_servers_running())
    del ids
    gc.collect()
    print("DROPPED", fds() - f0, threads() - t0, harp._harp.store_servers_running())
    u = harp.get_unique_id("127.0.0.1:0")
    h = u.hex()
    del u
    gc.collect()
    t = time.monotonic()
    try:
        harp.Communicator(0, 1, harp.UniqueId.from_hex(h), timeout=60)
        print("REUSED ok")
    except harp.InvalidArgumentError as e:
        print("REUSED", int(time.monotonic() - t < 10), "retired" in str(e))
""")


def test_dropped_unique_ids_release_their_store():
    """Each unique id's store (a thread, a listening port, an eventfd) goes when the id object is
    dropped unused: after 200 ids, fds and threads are back to where they were, and the dropped
    id's address refuses (within seconds, naming the retired store)."""
    out = subprocess.run([PY, "-c", DROP_PROG], env=ENV, capture_output=True, text=True, timeout=120)
    lines = {l.split()[0]: l.split()[1:] for l in out.stdout.splitlines() if l[:1].isupper()}
    assert lines.get("HELD") == ["400", "200", "200"], out  # what the ids hold while alive
    assert lines.get("DROPPED") == ["0", "0", "0"], out
    assert lines.get("REUSED") == ["1", "True"], out


OUTLIVE_PROG = textwrap.dedent("""
    import gc, os, subprocess, sys, time
    import numpy as np
    import harp
    def fds(): return len(os.listdir("/proc/self/fd"))
    def threads(): return len(os.listdir("/proc/self/task"))
    harp.Communicator(0, 1, harp.get_unique_id("127.0.0.1:0")).destroy()  # starts the process-wide services
    gc.collect()
    end = time.monotonic() + 30  # the baseline without that id's store (its thread and 2 fds go when it is dropped)
    while harp._harp.store_servers_running() and time.monotonic() < end:
        time.sleep(0.05)
    f0, t0 = fds(), threads()
    u = harp.get_unique_id("127.0.0.1:0")
    peer = subprocess.Popen([sys.executable, "-c", sys.argv[1], u.hex()], stdin=subprocess.PIPE, text=True)
    c = harp.Communicator(0, 2, u, timeout=60)
    del u
    gc.collect()
    x = np.ones(4); c.allreduce(x)
    sub = c.split(0)  # a rendezvous through the store after the id is gone
    y = np.ones(4); sub.allreduce(y)
    print("AFTER", float(x[0]), float(y[0]), harp._harp.store_servers_running())
    peer.stdin.write("bye\\n"); peer.stdin.close()
    sub.destroy(); c.destroy()
    peer.wait(60)
    end = time.monotonic() + 30
    while harp._harp.store_servers_running() and time.monotonic() < end:
        time.sleep(0.05)
    print("DESTROYED", harp._harp.store_servers_running(), fds() - f0, threads() - t0)
""")

OUTLIVE_PEER = textwrap.dedent("""
    import sys
    import numpy as np
    import harp
    c = harp.Communicator(1, 2, harp.UniqueId.from_hex(sys.argv[1]), timeout=60)
    x = np.ones(4); c.allreduce(x)
    sub = c.split(0)
    y = np.ones(4); sub.allreduce(y)
    sys.stdin.readline()
    sub.destroy(); c.destroy()
""")


def test_communicator_keeps_the_store_of_its_dropped_unique_id():
    """The rule: a communicator keeps its root's store alive for as long as any rank holds a
    connection (split, shrink, grow and agree rendezvous through it), whether or not the id object
    lives; the store goes once the last rank destroys its communicator."""
    out = subprocess.run([PY, "-c", OUTLIVE_PROG, OUTLIVE_PEER], env=ENV, capture_output=True, text=True,
                         timeout=180)
    lines = {l.split()[0]: l.split()[1:] for l in out.stdout.splitlines() if l[:1].isupper()}
    assert lines.get("AFTER") == ["2.0", "2.0", "1"], out
    assert lines.get("DESTROYED") == ["0", "0", "0"], out


# ----------------------------------------------------------------------------- the secret is never guessable offline


def test_connector_without_the_secret_receives_nothing_derived_from_it(server):
    """The store answers a client's first message with its nonce only, and proves the secret only to
    a client that proved it first: an outsider's transcript holds nothing to test guesses against."""
    s = socket.create_connection(server.addr, timeout=10)
    na = os.urandom(32)
    s.sendall(b"HARPSTR3" + na)
    got = b""
    s.settimeout(1)
    try:
        while len(got) < 200:
            chunk = s.recv(200)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, TimeoutError):
        pass
    key = hmac.new(server.secret, b"HARP-KEY1|store", hashlib.sha256).digest()
    assert len(got) == 32, got  # the store's nonce, nothing else
    s.sendall(os.urandom(32))  # a wrong proof
    s.settimeout(10)
    rest = b""
    while True:
        chunk = s.recv(200)
        if not chunk:
            break
        rest += chunk
    assert rest == b"\x00", rest  # refused, and nothing else
    for blob in (got, rest):
        assert _proof(key, b"B", na, got[:32]) not in blob
    s.close()
    assert "did not prove knowledge of this job's secret" in server.stderr()
    assert_serves(server)


@pytest.mark.parametrize("secret", ["x", "test-secret", "a" * 15])
def test_short_harp_secret_is_refused(secret):
    env = {"HARP_ADDR": "127.0.0.1:29995", "HARP_RANK": "0", "HARP_WORLD_SIZE": "1", "HARP_SECRET": secret}
    with pytest.raises(harp.InvalidArgumentError, match="HARP_SECRET") as e:
        harp.init(env=env)
    assert "16 bytes" in str(e.value) and "secrets.token_hex" in str(e.value), e.value
