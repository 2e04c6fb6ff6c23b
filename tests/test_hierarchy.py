"""Host detection and the hierarchical algorithms.

What is checked, against sources independent of the thing checked:
- the host key is the boot id with the net/IPC namespace inodes and /dev/shm's device, read here
  from /proc with os.stat; HARP_HOSTID replaces it;
- ranks with equal keys form one host (shm between them), different keys
  different hosts (tcp between them), uneven hosts (3+1, 2+1) are mapped as
  given; harp.topology's hosts, local ranks and rails match the HARP_HOSTID
  assignment made by the test;
- a rank in its own IPC + mount namespace (private /dev/shm) is another host by
  itself, and claiming the others' key with HARP_HOSTID does not fool the
  shared-memory probe;
- rail and leader allreduce agree with numpy for every dtype and op, odd
  counts, in place and out of place, on 2x2, 2x3 (6 ranks: not a power of two)
  and uneven hosts, and rail pipelined in many pieces; on uneven hosts rail
  runs its declared fallback (ring) and leader runs itself; leader broadcast
  agrees for roots at every position (leader, non-leader, either host);
- selection: hierarchical algorithms are never chosen at one rank per host or
  on one host (harp-config --explain and the runtime pick after a real call),
  and where the model says the flat pick is faster it stays.
Fake hosts on one machine: every rank sets HARP_HOSTID before harp.init().
"""
import ctypes
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import harp
from collectives_check import Checker, data, hosts_env, init_as
from harness import run_ranks

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18


def own_host_namespaces():
    """Private IPC and mount namespaces with a fresh /dev/shm: another host to HARP and to the probe."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWIPC | CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    # Private first: nothing mounted here may propagate to the machine's namespace.
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=64m") != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs /dev/shm")


# ---------------------------------------------------------------------------- host detection

def test_host_key_is_boot_id_and_namespaces():
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    ns = "".join(f"{n}{os.stat(f'/proc/self/ns/{n}').st_ino}" for n in ("net", "ipc"))
    assert harp._harp.host_id() == f"{boot}/{ns}shm{os.stat('/dev/shm').st_dev}"


def _shape(rank, size, ids):
    comm = init_as(rank, ids)
    t = harp.topology(comm)
    peers = [comm.transport(p) for p in range(size)]
    comm.destroy()
    return t, peers


@pytest.mark.parametrize("layout", [[3], [2, 2], [3, 1], [2, 1], [1, 1, 1]])
def test_host_map_follows_the_host_keys(layout):
    size = sum(layout)
    ids = hosts_env(layout) if len(layout) > 1 else None
    res = run_ranks(size, _shape, ids, env={"HARP_TRANSPORT": ""}, timeout=120)
    host_of = [h for h, n in enumerate(layout) for _ in range(n)]
    local = [i for n in layout for i in range(n)]
    for rank, (t, peers) in enumerate(res):
        assert t["rank"] == rank and t["size"] == size
        assert t["host_of"] == host_of and t["local_rank"] == local, t["text"]
        assert t["ranks_per_host"] == layout
        assert [h["ranks"] for h in t["hosts"]] == [[r for r in range(size) if host_of[r] == h]
                                                   for h in range(len(layout))]
        assert t["leaders"] == [t["hosts"][h]["ranks"][0] for h in range(len(layout))]
        assert t["rails"] == [[h["ranks"][i] for h in t["hosts"] if len(h["ranks"]) > i] for i in range(max(layout))]
        if ids:
            assert all(h["key"] == f"hostid:h{i}" for i, h in enumerate(t["hosts"]))
        for p in range(size):
            want = "self" if p == rank else ("shm" if host_of[p] == host_of[rank] else "tcp")
            assert peers[p] == want, (rank, p, peers)
    assert all(r[0]["text"] == res[0][0]["text"] for r in res)  # every rank sees the same map


def _namespaced(rank, size, claim):
    if rank == size - 1:
        own_host_namespaces()
    if claim:
        os.environ["HARP_HOSTID"] = "same"
    comm = harp.init()
    t = harp.topology(comm)
    peers = [comm.transport(p) for p in range(size)]
    x = np.full(1001, rank + 1, dtype=np.int64)
    comm.allreduce(x)
    comm.destroy()
    return t["host_of"], [h["key"] for h in t["hosts"]], peers, int(x[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for unshare(CLONE_NEWIPC | CLONE_NEWNS)")
@pytest.mark.parametrize("claim", [False, True], ids=["own-key", "forged-HARP_HOSTID"])
def test_rank_in_its_own_namespaces_is_another_host(claim):
    """3 ranks; the last one lives in private IPC + mount namespaces (its own /dev/shm)."""
    res = run_ranks(3, _namespaced, claim, timeout=120)
    for rank, (host_of, keys, peers, total) in enumerate(res):
        assert host_of == [0, 0, 1], (rank, host_of, keys)
        assert total == 6
        if claim:  # it claimed the others' key; the probe caught it
            assert keys[0] == "hostid:same" and keys[1].startswith("hostid:same/probe-failed/r2"), keys
        want = {0: ["self", "shm", "tcp"], 1: ["shm", "self", "tcp"], 2: ["tcp", "tcp", "self"]}[rank]
        assert peers == want, (rank, peers)


# ---------------------------------------------------------------------------- correctness

def _check(rank, size, ids, algos, sizes, env=None):
    os.environ.update(env or {})
    comm = init_as(rank, ids)
    ch = Checker(comm)
    ch.allreduce(sizes, algos)
    for root in sorted({0, 1, size - 1, size // 2}):  # broadcast leader: roots on every kind of host position
        for n in sizes:
            for dt in (np.dtype(np.int8), np.dtype(np.float64)):
                want = data(root, n, dt, salt=root)
                b = want.copy() if rank == root else np.zeros(n, dt)
                comm.broadcast(b, root, algo="leader")
                ch.expect(f"broadcast leader {dt} n={n} root={root}", b, want, dt)
    x = np.arange(100003, dtype=np.float32) * (rank + 1)  # several segments, odd count, in place
    comm.allreduce(x, algo=algos[0])
    ok = np.array_equal(x, np.arange(100003, dtype=np.float32) * (size * (size + 1) // 2))
    comm.destroy()
    return ch.failures, ch.calls, ok


@pytest.mark.parametrize("layout,seg", [([2, 2], None), ([3, 3], None), ([3, 1], None), ([2, 1], None),
                                        ([2, 2], "4096")], ids=["2x2", "2x3", "3+1", "2+1", "2x2-pipelined"])
def test_rail_and_leader_match_numpy_for_every_dtype_and_op(layout, seg):
    """seg: HARP_SEGMENT_BYTES=4096 makes rail pipeline above 32 KB (pieces of 8 segments), so the
    20001-element calls and the 100003-element one run many pieces with the rail legs async."""
    size = sum(layout)
    sizes = (0, 1, 3, 7, 1031) + ((20001,) if seg else ())
    env = {"HARP_SEGMENT_BYTES": seg} if seg else {}
    res = run_ranks(size, _check, hosts_env(layout), ["rail", "leader"], sizes, env, timeout=300)
    for failures, calls, big_ok in res:
        assert not failures, failures[:10]
        assert calls > 500 and big_ok


def _picks(rank, size, ids, env):
    os.environ.update(env)
    comm = init_as(rank, ids)
    out = {}
    for n in (2, 1 << 20):  # 8 bytes and 4 MB of float32
        x = np.ones(n, dtype=np.float32)
        comm.allreduce(x)
        assert x[0] == size
        out[n] = comm._c.last_algorithm(int(harp.comm.Coll["allreduce"]))
    comm.destroy()
    return out


def test_uneven_hosts_rail_asked_for_runs_its_fallback_and_is_right():
    # HARP_ALGO is a user choice the memo records (algo= is not): last_algorithm says what ran.
    res = run_ranks(4, _picks, hosts_env([3, 1]), {"HARP_ALGO": "rail"}, timeout=120)
    assert all(r == {2: "ring", 1 << 20: "ring"} for r in res), res
    res = run_ranks(3, _picks, hosts_env([2, 1]), {"HARP_ALGO": "leader"}, timeout=120)
    assert all(r == {2: "leader", 1 << 20: "leader"} for r in res), res


@pytest.mark.parametrize("layout", [[1, 1, 1, 1], [4]], ids=["1-per-host", "one-host"])
def test_runtime_never_picks_hierarchy_at_one_rank_per_host_or_one_host(layout):
    res = run_ranks(4, _picks, hosts_env(layout) if len(layout) > 1 else None, {}, timeout=120)
    for r in res:
        assert set(r.values()).isdisjoint({"rail", "leader"}), r


def test_runtime_pick_equals_explain_on_fake_hosts():
    res = run_ranks(4, _picks, hosts_env([2, 2]), {}, timeout=120)
    for n, want in ((8, res[0][2]), (4 << 20, res[0][1 << 20])):
        assert explain_pick("allreduce", str(n), [2, 2])[0] == want
    assert all(r == res[0] for r in res), res  # every rank picked alike


# ---------------------------------------------------------------------------- selection (--explain)

def explain_cli(*args, env=None):
    r = subprocess.run([sys.executable, "-m", "harp.tools.config", "--explain", *args], capture_output=True, text=True,
                       timeout=120, env=dict(ENV, **(env or {})))
    assert r.returncode == 0, r.stderr
    return r.stdout


def parse_pick(out):
    m = re.search(r"^pick: (\w+) \((.*)\)$", out, re.M)
    return m.group(1), m.group(2), out


def explain_pick(coll, size, ppn, transport="mixed"):
    """In-process harp-config --explain (the same C++ selector); ppn: ranks per host."""
    from harp.tools.config import explain
    return parse_pick("\n".join(explain(coll, size, sum(ppn), transport, ppn=ppn)))


def test_explain_cli_takes_hosts_and_ppn():
    out = explain_cli("allreduce", "32M", "--hosts", "2", "--ppn", "2", "--transport", "mixed")
    assert "4 ranks, 2 hosts x 2" in out and parse_pick(out)[0] == "rail", out
    out = explain_cli("allreduce", "32M", "--ppn", "3,1", "--transport", "mixed")
    assert "4 ranks, 2 hosts x 3/1" in out and parse_pick(out)[0] != "rail", out


@pytest.mark.parametrize("size", ["8", "64K", "4M", "256M"])
@pytest.mark.parametrize("ppn", [[1, 1, 1, 1], [8], [1] * 8], ids=["4x1", "1x8", "8x1"])
def test_explain_never_picks_hierarchy_at_one_rank_per_host_or_one_host(size, ppn):
    pick, why, out = explain_pick("allreduce", size, ppn)
    assert pick not in ("rail", "leader"), out
    for name in ("rail", "leader"):
        assert re.search(rf"^  {name} .*failed: needs", out, re.M), out


def test_explain_picks_rail_for_large_messages_on_2x2_and_says_why(monkeypatch):
    pick, why, out = explain_pick("allreduce", "32M", [2, 2])
    assert pick == "rail" and "hierarchical rail predicted" in why and "flat pick ring_weighted" in why, out
    monkeypatch.setenv("HARP_HIER", "0")
    assert explain_pick("allreduce", "32M", [2, 2])[0] == "ring_weighted"
    monkeypatch.delenv("HARP_HIER")
    pick, _, out = explain_pick("allreduce", "32M", [3, 1])
    assert pick != "rail" and re.search(r"^  rail .*failed: needs the same rank count", out, re.M), out


def test_small_messages_on_block_placed_hosts_keep_recursive_doubling():
    """2x2 and 4x2 at 8 B: recursive doubling's first log2 L rounds stay inside a host, so it crosses the
    network log2 H times, as leader does, without leader's intra reduce and broadcast: the model keeps it
    (the arena sweep measured it below leader at 2x2, 8 B-2 KB). Larger messages put L x n on a host's
    uplink per round, and recursive doubling is no longer the pick. (At 2x2, 256 KB rail was the pick
    until the ring's host-aware cost hid its latencies behind the host link: the ring, 193 us, and rail,
    199 us, now tie within 4%, so no hierarchy beats every flat candidate and the tuning row's
    halving-doubling runs; rail stays the cheaper hierarchy.)"""
    for ppn in ([2, 2], [2, 2, 2, 2]):
        pick, why, out = explain_pick("allreduce", "8", ppn)
        assert pick == "recursive_doubling" and seconds(out, "recursive_doubling") < seconds(out, "leader"), out
        pick, why, out = explain_pick("allreduce", "256K", ppn)
        assert pick != "recursive_doubling" and seconds(out, pick) < seconds(out, "recursive_doubling"), out
    out = explain_pick("allreduce", "256K", [2, 2])[2]
    assert seconds(out, "rail") < seconds(out, "leader") and seconds(out, "rail") < 1.05 * seconds(out, "ring"), out


def test_runtime_costs_recursive_doubling_by_host_only_for_consecutive_ranks():
    """Interleaved placement (h0 h1 h0 h1) puts recursive doubling's first round across hosts: then every
    round is costed as a network hop, as before, and a hierarchical algorithm (one network hop; leader
    and rail tie within a microsecond here) is the 8-byte pick, the same on every rank."""
    blocked = run_ranks(4, _picks, hosts_env([2, 2]), {}, timeout=120)
    mixed = run_ranks(4, _picks, ["h0", "h1", "h0", "h1"], {}, timeout=120)
    assert [r[2] for r in blocked] == ["recursive_doubling"] * 4, blocked
    assert len({r[2] for r in mixed}) == 1 and mixed[0][2] in ("leader", "rail"), mixed


def seconds(out, name):
    m = re.search(rf"^  {name} .*?([\d.]+) (s|ms|us|ns)  ", out, re.M)
    return float(m.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]


@pytest.mark.parametrize("ppn", [[2, 2], [2] * 4, [3] * 3, [4, 4], [3, 1]], ids=["2x2", "4x2", "3x3", "2x4", "3+1"])
@pytest.mark.parametrize("size", ["8", "4K", "256K", "4M", "64M"])
def test_hierarchy_is_picked_only_where_the_model_says_it_is_faster(ppn, size, monkeypatch):
    """A hierarchical algorithm is picked exactly where its predicted time is the least of the applicable
    hierarchical ones and below both the flat tuning pick and the cheapest flat candidate (a row was
    measured against flat algorithms only); elsewhere the flat pick stands."""
    pick, why, out = explain_pick("allreduce", size, ppn)
    monkeypatch.setenv("HARP_HIER", "0")
    flat = explain_pick("allreduce", size, ppn)[0]
    ok = re.findall(r"^  (\w+) .*  ok", out, re.M)
    hier = [n for n in ("rail", "leader") if n in ok]
    bar = min([seconds(out, flat)] + [seconds(out, n) for n in ok if n not in ("rail", "leader")])
    best_hier = min(hier, key=lambda n: seconds(out, n)) if hier else None
    if best_hier and seconds(out, best_hier) < bar:
        assert pick == best_hier, out
    else:
        assert pick == flat, out


# ---------------------------------------------------------------------------- failures

def _dies(rank, size, ids, algo):
    comm = init_as(rank, ids)
    x = np.ones(1 << 16, dtype=np.float32)
    comm.allreduce(x, algo=algo)  # the sub-communicators exist now
    comm.barrier()
    if rank == size - 1:
        os._exit(3)
    try:
        for _ in range(3):
            comm.allreduce(x, algo=algo)
    except harp.HarpError as e:
        return type(e).__name__, str(e)[:300]
    return "no error", ""


@pytest.mark.parametrize("algo", ["rail", "leader"])
def test_a_dead_rank_raises_on_every_rank_not_a_hang(algo):
    """Rank 3 of 2x2 exits after the legs exist; ranks 0-2 (two of them never talk to it directly in
    some legs) raise a HARP error well before HARP_TIMEOUT (the harness would report a hang)."""
    res = run_ranks(4, _dies, hosts_env([2, 2]), algo, env={"HARP_TIMEOUT": "600"}, timeout=150,
                    allow_errors=True)
    assert res[3][0] == "died"
    for rank in range(3):
        status, (kind, msg) = res[rank]
        assert status == "ok" and kind in ("PeerError", "MismatchError"), (rank, kind, msg)
