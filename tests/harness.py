"""Multi-process test harness: run a function as N HARP ranks and collect results.

    results = run_ranks(4, fn, arg1, env={"HARP_TRANSPORT": "tcp"}, timeout=120)

Each rank is a forked process that gets HARP_* launch variables (a fresh unique
id per call), builds nothing itself, and calls fn(rank, size, *args); fn usually
starts with `comm = harp.init()`. A rank's return value (picklable) or its
exception (as text) comes back; a rank that hangs past `timeout` fails the test
with the list of ranks still running, and all ranks are killed.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback

import harp

_ctx = mp.get_context("fork")


class RankFailure(AssertionError):
    pass


def _child(fn, rank, size, uid_hex, env, q, args):
    # A rank that crashes (SIGSEGV, SIGABRT) prints its Python stack to stderr, which pytest shows
    # with the failure: the parent only sees ("died", -11).
    import faulthandler

    faulthandler.enable()
    try:
        os.environ.update({"HARP_UNIQUE_ID": uid_hex, "HARP_RANK": str(rank), "HARP_WORLD_SIZE": str(size),
                           "HARP_LOCAL_RANK": str(rank)})
        os.environ.update(env or {})
        q.put((rank, "ok", fn(rank, size, *args)))
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        q.put((rank, "error", (type(e).__name__, str(e), traceback.format_exc())))
    finally:
        q.close()
        q.join_thread()


def start_ranks(n, fn, *args, env=None, uid=None):
    uid = uid or harp.get_unique_id("127.0.0.1:0")  # local ranks: keep traffic on loopback
    q = _ctx.Queue()
    q.uid = uid  # the id object owns its store: keep it until the ranks are collected (harp.UniqueId)
    procs = [_ctx.Process(target=_child, args=(fn, r, n, uid.hex(), env, q, args), daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    return procs, q


def collect(procs, q, timeout=120, allow_errors=False):
    n = len(procs)
    out, deadline = {}, time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            rank, status, val = q.get(timeout=min(left, 0.5))
            out[rank] = (status, val)
        except Exception:  # queue.Empty
            # A rank that died without reporting (killed) counts as reported.
            for r, p in enumerate(procs):
                if r not in out and not p.is_alive() and p.exitcode not in (0, None):
                    out[r] = ("died", p.exitcode)
    hung = [r for r in range(n) if r not in out]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
    if hung:
        raise RankFailure(f"ranks {hung} did not finish within {timeout} s (hang)")
    if not allow_errors:
        errs = {r: v for r, (s, v) in out.items() if s != "ok"}
        if errs:
            msg = "\n".join(f"rank {r}: {v[0]}: {v[1]}\n{v[2]}" if isinstance(v, tuple) and len(v) == 3
                            else f"rank {r}: {v}" for r, v in sorted(errs.items()))
            raise RankFailure(msg)
        return [out[r][1] for r in range(n)]
    return [out[r] for r in range(n)]


def own_socket_inodes():
    """Inodes of this process's sockets (its /proc/self/fd links "socket:[N]"), to find its rows in
    /proc/net/{tcp,udp}{,6}."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def own_tcp_peers():
    """(address, port) of the far end of every connected TCP socket this process holds, asked of
    each socket fd itself (getpeername on a duplicate). Unlike /proc/net/tcp, whose page-by-page
    reads can skip rows while other processes open and close sockets, this cannot miss one."""
    import socket

    peers = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:["):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                peers.append(s.getpeername()[:2])
        except OSError:
            pass  # a listener or an unconnected socket
        finally:
            s.close()
    return peers


def run_ranks(n, fn, *args, env=None, timeout=120, allow_errors=False, uid=None):
    procs, q = start_ranks(n, fn, *args, env=env, uid=uid)
    return collect(procs, q, timeout, allow_errors)


def killed_last_rank(rank, size, count, delay):
    """A run_ranks job: every rank allreduces `count` float32s; the last rank SIGKILLs itself
    `delay` s into a loop of allreduces, the others return (error class name, text, seconds from
    the start of their loop to the error), or ("no error", "", seconds) after 1000 calls."""
    import signal
    import threading

    import numpy as np

    comm = harp.init(timeout=60)
    x = np.ones(count, np.float32)
    comm.allreduce(x)
    if rank == size - 1:
        threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        while True:
            comm.allreduce(x)
    return first_error(lambda: comm.allreduce(x), 1000)


def first_error(call, times):
    """Calls call() up to `times` times: (the HarpError's class name, its text, seconds until it),
    or ("no error", "", seconds) when every call succeeded (a survivor's view of a lost peer)."""
    t0 = time.monotonic()
    try:
        for _ in range(times):
            call()
    except harp.HarpError as e:
        return type(e).__name__, str(e), time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def transport_env(tr):
    """The environment that pins a job to one transport (tcp, shm, ...)."""
    return {"HARP_TRANSPORT": tr}


def outcome(fn):
    """("ok", fn()) or (the HarpError's class name, its text): lets a rank report an expected error."""
    try:
        return "ok", fn()
    except harp.HarpError as e:
        return type(e).__name__, str(e)


def outcome_and_next(comm, call):
    """call()'s outcome, then a small allreduce's: does the communicator still work after it? A rank
    whose call failed stays alive a second, as an application would (exiting is another failure)."""
    import numpy as np

    first = outcome(call)
    second = outcome(lambda: comm.allreduce(np.ones(2, np.float32)).tolist())
    if first[0] != "ok":
        time.sleep(1)
    return first, second
