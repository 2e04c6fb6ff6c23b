"""Verbs scenarios run INSIDE the Soft-RoCE guest (scripts/rxe-vm) by tests/test_verbs.py.

    python tests/verbs_guest.py [SCENARIO ...]      # default: all

One Python process (imports are slow under emulation) runs each scenario with
ranks forked by tests/harness.py, all over the one rxe0 device (loopback queue
pairs), and prints one line per scenario:

    VERBS-RESULT {"name": ..., "ok": true|false, "detail": ..., "seconds": ...}

tests/test_verbs.py turns each line into its own pytest test. A scenario checks
its own results and reports failures in "detail"; nothing here is mocked: the
bytes move through libibverbs and the kernel's rdma_rxe.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import harp  # noqa: E402
import collectives_check as cc  # noqa: E402
from harness import killed_last_rank, run_ranks  # noqa: E402
from selection_check import choice_problem, chosen_transports  # noqa: E402

VERBS = {"HARP_TRANSPORT": "verbs"}


def _log_to(path):
    """Send this rank's stderr (HARP's log) to a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


# ---------------------------------------------------------------------------- scenarios
def s_devices():
    import harp.verbs

    devs = harp.verbs.devices()
    names = [d["name"] for d in devs]
    assert "rxe0" in names, names
    rxe = devs[names.index("rxe0")]
    port = rxe["ports"][0]
    assert port["state"] == "ACTIVE" and port["link_layer"] == "Ethernet", port
    assert any(g["type"] == "RoCE v2" and "ffff" in g["gid"] for g in port["gids"]), port["gids"]
    return f"{names}; rxe0 port 1 {port['state']} {port['link_layer']} mtu {port['active_mtu']}, " \
           f"{len(port['gids'])} GIDs"


def _transports(rank, size):
    comm = harp.init()
    names = {comm.transport(p) for p in range(size) if p != rank}
    comm.barrier()
    comm.destroy()
    return sorted(names)


def s_selection():
    forced = run_ranks(3, _transports, env=VERBS, timeout=90)
    assert all(t == ["verbs"] for t in forced), forced
    # Without HARP_TRANSPORT, ranks on different hosts (own IPC namespaces, see
    # selection_check.py: shm cannot reach across) must get verbs (priority 20),
    # never tcp (10).
    auto = {"HARP_TRANSPORT": "auto"}
    res = run_ranks(2, chosen_transports, True, env=auto, timeout=90)
    assert choice_problem(res, "verbs") is None, choice_problem(res, "verbs")
    # The check can fail: with verbs disabled (HARP_IB_HCA names no device) the
    # same ranks get tcp and the same check reports it.
    off = run_ranks(2, chosen_transports, True, env=dict(auto, HARP_IB_HCA="nosuchdev0"), timeout=90)
    problem = choice_problem(off, "verbs")
    assert problem and "with tcp, not verbs" in problem, (problem, off)
    return f"forced: {forced[0]}, automatic across hosts: {res[0][1]}; verbs disabled: {problem}"


def _matrix(rank, size, sizes):
    comm = harp.init()
    assert all(comm.transport(p) == "verbs" for p in range(size) if p != rank)
    failures, calls = cc.check_everything(comm, sizes)
    comm.destroy()
    return failures, calls


def s_collectives():
    # Every collective, algorithm, op and root; a subset of dtypes (the full
    # dtype matrix runs over TCP on the host; emulation is ~50x slower).
    out = []
    for n, dts in ((4, [np.float32, np.int64]), (3, [np.float32])):
        cc.DTYPES = [np.dtype(d) for d in dts]
        res = run_ranks(n, _matrix, (0, 1, 1031), env=VERBS, timeout=240)
        failures = [f for fs, _ in res for f in fs]
        calls = sum(c for _, c in res)
        assert calls > 100 * n, calls
        assert not failures, "\n".join(failures[:20])
        out.append(f"{n} ranks ({', '.join(str(np.dtype(d)) for d in dts)}): {calls} checks")
    return "; ".join(out)


def _large(rank, size, n, algos):
    comm = harp.init()
    x0 = ((np.arange(n, dtype=np.int64) * 13 + rank) % 1000).astype(np.float32)
    exp = sum(((np.arange(n, dtype=np.int64) * 13 + r) % 1000) for r in range(size)).astype(np.float32)
    bad = []
    for algo in algos:
        out = np.empty_like(x0)
        comm.allreduce(x0, out, algo=algo)
        if not np.array_equal(out, exp):
            bad.append(f"{algo}: first wrong index {int(np.argmax(out != exp))}")
    b = np.arange(n, dtype=np.float32) if rank == 1 else np.zeros(n, np.float32)
    comm.broadcast(b, root=1, algo="pipeline")
    if not np.array_equal(b, np.arange(n, dtype=np.float32)):
        bad.append("broadcast pipeline")
    comm.destroy()
    return bad


def s_large():
    # 4 MB per rank; HARP_IB_CHUNK=96K splits every message into many RDMA writes.
    n = 1024 * 1024 + 13
    env = dict(VERBS, HARP_IB_CHUNK="96K")
    res = run_ranks(4, _large, n, ["ring", "halving_doubling"], env=env, timeout=240)
    assert not any(res), res
    return f"4 ranks, {n * 4 / 1e6:.1f} MB allreduce (ring, halving_doubling) + pipeline broadcast, 96K chunks"


def _cache(rank, size, mode, iters):
    stats = f"/tmp/harp-verbs-cache-{mode}-{rank}.txt"
    os.environ["HARP_IB_STATS_FILE"] = stats  # the transport appends its MR cache counters when it closes
    if os.path.exists(stats):
        os.unlink(stats)
    comm = harp.init()
    ok = True
    if mode == "lazy":
        x = np.ones(100_000, np.float32)
        out = np.empty_like(x)
        for _ in range(iters):
            comm.allreduce(x, out)
            ok &= bool(np.all(out == size))
    else:
        # Fresh arrays every time: glibc hands back the same addresses with new
        # pages; a registration cached across calls would corrupt this.
        for i in range(iters):
            x = np.full(100_000, float(i + rank), np.float32)
            out = np.empty_like(x)
            comm.allreduce(x, out)
            ok &= bool(np.all(out == sum(i + r for r in range(size))))
            del x, out
    comm.destroy()
    text = open(stats).read() if os.path.exists(stats) else ""
    m = re.search(r"mode=(\w+) registrations=(\d+) hits=(\d+) deregistrations=(\d+) evictions=(\d+) live=(\d+)",
                  text)
    return ok, (m.groups() if m else None), text


def s_mr_cache():
    iters = 15
    lazy = run_ranks(3, _cache, "lazy", iters, env=dict(VERBS, HARP_IB_MR_CACHE="lazy"), timeout=180)
    safe = run_ranks(3, _cache, "safe", iters, env=VERBS, timeout=180)
    detail = []
    for mode, res in (("lazy", lazy), ("safe", safe)):
        for rank, (ok, stats, text) in enumerate(res):
            assert ok, f"{mode} rank {rank}: wrong allreduce result"
            assert stats, f"{mode} rank {rank}: no MR cache statistics written: {text!r}"
            kind, reg, hits, dereg, _evict, live = stats[0], *map(int, stats[1:])
            assert kind == mode, stats
            if mode == "lazy":
                # Two arrays (+ the scratch buffer the algorithm may use): each
                # registered once, then served from the cache on every call.
                assert reg <= 8, f"lazy rank {rank}: {reg} registrations for {iters} calls on the same arrays"
                assert hits >= iters, f"lazy rank {rank}: only {hits} cache hits"
            else:
                assert reg >= iters, f"safe rank {rank}: {reg} registrations, expected one per call at least"
                assert dereg == reg and live == 0, stats
            if rank == 0:
                detail.append(f"{mode}: registrations={reg} hits={hits} deregistrations={dereg} live={live}")
    return "; ".join(detail) + f" ({iters} allreduces of 400 KB, 3 ranks)"


def s_killed_peer():
    res = run_ranks(4, killed_last_rank, 1_000_000, 0.3, env=VERBS, timeout=120, allow_errors=True)
    assert res[-1][0] == "died", res[-1]
    worst = 0.0
    for status, val in res[:-1]:
        assert status == "ok", val
        cls, msg, dt = val
        assert cls == "PeerError", (cls, msg)
        assert "rank" in msg, msg
        assert dt < 20, f"detection took {dt:.1f} s"
        worst = max(worst, dt)
    return f"3 survivors raised PeerError within {worst:.1f} s: {res[0][1][1][:160]}"


def _mismatch(rank, size):
    comm = harp.init(timeout=60)
    n = 200 if rank == 1 else 100
    t0 = time.monotonic()
    try:
        comm.allreduce(np.ones(n, np.float32))
    except harp.HarpError as e:
        return type(e).__name__, str(e), time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def s_mismatch():
    res = run_ranks(3, _mismatch, env=VERBS, timeout=90)
    for cls, msg, dt in res:
        assert cls == "MismatchError", (cls, msg)
        assert dt < 20, dt
    return "every rank: MismatchError; " + next(m for _, m, _ in res if "called" in m)[:200]


def _abort(rank, size):
    comm = harp.init(timeout=60)
    if rank == 0:
        time.sleep(1.0)
        comm.abort("user gave up")
        return "aborted", "", 0.0
    t0 = time.monotonic()
    try:
        comm.allreduce(np.ones(4, np.float32))
    except harp.HarpError as e:
        return type(e).__name__, str(e), time.monotonic() - t0
    return "no error", "", 0.0


def s_abort():
    res = run_ranks(3, _abort, env=VERBS, timeout=90)
    for cls, msg, dt in res[1:]:
        assert cls == "PeerError" and "user gave up" in msg, (cls, msg)
        assert dt < 10, dt
    return res[1][1][:200]


def s_selftest():
    exe = os.environ.get("HARP_VERBS_SELFTEST", "")
    if not exe or not os.access(exe, os.X_OK):
        return "SKIP: harp_verbs_selftest not built (HARP_VERBS_SELFTEST unset)"
    out = []
    for args, env in ((["data", "2"], {}), (["mismatch"], {}), (["mismatch-rdv"], {}), (["kill"], {}), (["abort"], {}),
                      (["cache", "3"], {"HARP_IB_MR_CACHE": "lazy"})):
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ, **env))
        assert r.returncode == 0, f"selftest {args}: rc {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
        out.append(r.stdout.strip().splitlines()[-1])
    return "; ".join(out)


SCENARIOS = {
    "devices": s_devices,
    "selection": s_selection,
    "collectives": s_collectives,
    "large": s_large,
    "mr_cache": s_mr_cache,
    "killed_peer": s_killed_peer,
    "mismatch": s_mismatch,
    "abort": s_abort,
    "selftest": s_selftest,
}


def main(argv):
    names = argv or list(SCENARIOS)
    for name in names:
        t0 = time.monotonic()
        try:
            detail = SCENARIOS[name]()
            ok = True
        except BaseException as e:  # noqa: BLE001 - report, then go on with the next scenario
            ok, detail = False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
        rec = {"name": name, "ok": ok, "detail": str(detail), "seconds": round(time.monotonic() - t0, 1)}
        print("VERBS-RESULT " + json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
