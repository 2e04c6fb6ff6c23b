"""The last gaps in security and memory safety, on tcp and shm.

* Rooted collectives check their descriptors with fewer messages: the data
  itself vouches for the root (broadcast, scatter) or the leaves (gather).
  Any disagreement about root, count, dtype or algorithm still raises
  MismatchError on every rank, for every algorithm and rank count (generated:
  per-rank roots, counts, dtypes, broadcast algorithms): in that very call, or,
  on a rank that only sent data in it (broadcast/scatter root, gather
  non-root), at its next call (core/engine/context.h, deferred check).
* Threads sharing a communicator without overlapping (item 7): each thread's
  calls differ in their descriptor, so a call that two ranks pair differently
  raises MismatchError — no wrong result is ever returned silently.
* A reused unique id whose store has retired (item 10), or whose creator
  exited, fails within seconds with a text saying so, not at the timeout.
"""
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harp
from harness import outcome, outcome_and_next, run_ranks, transport_env
from test_semantics import _threads

TRANSPORTS = ["tcp", "shm"]


_env = transport_env
_outcome = outcome


# ---------------------------------------------------------------------------- item 1: data-carried check
def _rooted(rank, size, coll, spec):
    root, count, dtype, algo = spec[rank]
    if algo:
        os.environ["HARP_ALGO"] = "broadcast:" + algo
    comm = harp.init(timeout=60)
    dt = np.dtype(dtype)

    def call():
        if coll == "broadcast":
            x = np.full(count, rank + 1, dt)
            comm.broadcast(x, root=root)
            return x.tolist()
        if coll == "gather":
            g = comm.gather(np.full(count, rank + 1, dt), root=root)
            return None if g is None else np.asarray(g).ravel().tolist()
        out = np.zeros(count, dt)
        comm.scatter(np.arange(count * size, dtype=dt) if rank == root else None, out, root=root)
        return out.tolist()

    return outcome_and_next(comm, call)


def _expected(coll, rank, size, root, count):
    if coll == "broadcast":
        return [root + 1] * count
    if coll == "gather":
        return [q + 1 for q in range(size) for _ in range(count)] if rank == root else None
    return list(range(rank * count, (rank + 1) * count))


def _check_rooted(coll, spec, res):
    n = len(spec)
    agree = len(set(spec)) == 1
    for rank, (first, second) in enumerate(res):
        if agree:
            root, count = spec[0][0], spec[0][1]
            assert first == ("ok", _expected(coll, rank, n, root, count)), (spec, res)
            assert second == ("ok", [float(n)] * 2), (spec, res)
        else:
            # on every rank, in that very call or, where the rank only sent, at its next call
            # A rank that only sent, and a broadcast/scatter receiver whose data (tagged with the
            # root's exact descriptor) agreed with its call, may return and raise at its next call.
            only_sent = (spec[rank][0] == rank) == (coll != "gather")
            late = first[0] == "ok" and (only_sent or coll != "gather")
            assert first[0] == "MismatchError" or late, (spec, res)
            assert second[0] == "MismatchError", (spec, res)  # and it stays broken
            if late and not only_sent:
                root, count = spec[rank][0], spec[rank][1]
                assert first[1] == _expected(coll, rank, n, root, count), (rank, spec, res)
                assert "earlier call #" in second[1], (rank, spec, res)


@pytest.mark.parametrize("tr", TRANSPORTS)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_rooted_disagreements_generated_with_the_data_carried_check(tr, data):
    n = data.draw(st.sampled_from([2, 3, 4]))
    coll = data.draw(st.sampled_from(["broadcast", "scatter", "gather"]))
    one = st.tuples(st.integers(0, n - 1), st.sampled_from([1, 7]), st.sampled_from(["float32", "int32"]),
                    st.sampled_from(["binomial", "pipeline"] if coll == "broadcast" else [""]))
    # mostly one shared descriptor with a few ranks changed, so each field's disagreement is drawn alone too
    base = data.draw(one)
    spec = [data.draw(st.one_of(st.just(base), one)) for _ in range(n)]
    _check_rooted(coll, spec, run_ranks(n, _rooted, coll, spec, env=_env(tr), timeout=120))


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("coll", ["broadcast", "scatter", "gather"])
def test_each_rank_alone_disagreeing_about_the_root_fails_everyone(tr, coll):
    """4 ranks, pipeline broadcast (a chain: most ranks get nothing from the root directly):
    the last rank alone names another root."""
    algo = "pipeline" if coll == "broadcast" else ""
    spec = [(0, 7, "float32", algo)] * 3 + [(2, 7, "float32", algo)]
    _check_rooted(coll, spec, run_ranks(4, _rooted, coll, spec, env=_env(tr), timeout=120))


# ---------------------------------------------------------------------------- item 7: threads, order
# _threads (test_semantics): two threads per rank race on one communicator, each
# thread's calls with their own count.


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_threads_racing_without_overlap_never_get_a_wrong_result(tr):
    """Two threads per rank race on one communicator. Every call that two ranks pair
    differently raises (MismatchError: the descriptors differ; InvalidArgumentError at an
    overlap; PeerError once a peer broke): 0 wrong results, against about half without
    the checks. Identical calls from two threads cannot be told apart (README, Threading)."""
    res = run_ranks(2, _threads, 600, True, env=_env(tr), timeout=180)
    for wrong, errors, late in res:
        assert wrong == [], wrong[:12]
        assert not late, late[:12]  # nothing returned after this rank's first error
        for cls, msg in errors:
            assert cls in ("InvalidArgumentError", "PeerError", "MismatchError"), (cls, msg)
    # the race did happen: some thread on some rank was stopped
    assert any(errors for _, errors, _ in res), res


# ---------------------------------------------------------------------------- item 10: retired store
def _init_once(rank, size):
    t0 = time.monotonic()
    try:
        comm = harp.init(timeout=120)
        comm.allreduce(np.ones(3, np.float32))
        comm.destroy()
        return "ok", "", time.monotonic() - t0
    except harp.HarpError as e:
        return type(e).__name__, str(e), time.monotonic() - t0


def _retired(before):
    end = time.monotonic() + 60
    while harp._harp.store_servers_running() > before and time.monotonic() < end:
        time.sleep(0.05)
    return harp._harp.store_servers_running() <= before


def test_reused_id_whose_store_retired_fails_within_seconds():
    before = harp._harp.store_servers_running()
    uid = harp.get_unique_id("127.0.0.1:0")
    first = run_ranks(2, _init_once, uid=uid, timeout=120)
    assert all(r[0] == "ok" for r in first), first
    assert _retired(before), "the store did not retire after its communicator"
    again = run_ranks(2, _init_once, uid=uid, env={"HARP_TIMEOUT": "120"}, timeout=150)
    for cls, msg, secs in again:
        assert cls == "InvalidArgumentError", again
        assert "already used" in msg and "retired" in msg and "one communicator" in msg, msg
        assert secs < 60, again  # seconds, not the 120 s timeout


def test_id_whose_creator_exited_fails_within_seconds():
    import subprocess
    import sys
    prog = "import harp; print(harp.get_unique_id('127.0.0.1:0').hex(), flush=True)"
    uid_hex = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))).stdout.strip()
    res = run_ranks(2, _init_once, uid=harp.UniqueId.from_hex(uid_hex), env={"HARP_TIMEOUT": "120"}, timeout=150)
    for cls, msg, secs in res:
        assert cls == "InvalidArgumentError" and "creator exited" in msg, res
        assert secs < 60, res


# ---------------------------------------------------------------------------- item 6: abort at any moment
def _abort_anytime(rank, size, delay):
    """Every rank loops allreduces; rank 0 aborts from a timer thread `delay` s in, wherever
    its loop is. Returns (successes, values correct, first error, the next call's error)."""
    comm = harp.init(timeout=60)
    comm.barrier()
    if rank == 0:
        threading.Timer(delay, lambda: comm.abort("timer fired")).start()
    done, right, first = 0, True, None
    for i in range(1, 100000):
        x = np.full(4, i, np.int64)
        try:
            comm.allreduce(x)
        except harp.HarpError as e:
            first = (type(e).__name__, str(e))
            break
        right &= bool(np.all(x == size * i))
        done += 1
    nxt = _outcome(lambda: comm.allreduce(np.ones(2, np.float32)).tolist())
    time.sleep(1)  # stay alive: exiting is another failure
    return done, right, first, nxt


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("delay", [0.1])
def test_abort_at_any_moment_ranks_differ_by_at_most_the_collective_in_flight(tr, delay):
    """abort() (ULFM/NCCL semantics, README 'Errors'): the collective in flight when it is
    called may still complete on peers whose data had all arrived; every later call on every
    rank raises. So each peer completed either as many collectives as the aborting rank or one
    more, never fewer and never two more, and its next call fails with PeerError."""
    res = run_ranks(3, _abort_anytime, delay, env=_env(tr), timeout=120)
    k0 = res[0][0]
    for rank, (done, right, first, nxt) in enumerate(res):
        assert right, res
        assert first is not None and nxt[0] != "ok", res
        if rank:
            assert done in (k0, k0 + 1), res
            assert first[0] == "PeerError" and "rank 0" in first[1], res
            assert nxt[0] == "PeerError", res


# ---------------------------------------------------------------------------- root-only argument errors
def _root_bad_buffer(rank, size, coll):
    comm = harp.init(timeout=120)
    comm.barrier()
    t0 = time.monotonic()

    def call():
        x = np.ones(3, np.float32)
        if coll == "gather":
            comm.gather(x, np.empty(3 * size - 1, np.float32) if rank == 0 else None, root=0)
        elif coll == "reduce":
            comm.reduce(x, np.empty(2, np.float32) if rank == 0 else None, root=0)
        else:
            comm.scatter(np.ones(3 * size + 1, np.float32) if rank == 0 else None, x, root=0)

    got = _outcome(call)
    secs = time.monotonic() - t0
    nxt = _outcome(lambda: comm.allreduce(np.ones(2, np.float32)).tolist())
    time.sleep(1)  # stay alive: exiting is another failure
    return got, nxt, secs


@pytest.mark.parametrize("tr", TRANSPORTS)
@pytest.mark.parametrize("coll", ["gather", "reduce", "scatter"])
def test_a_roots_own_argument_error_reaches_every_rank_with_its_text(tr, coll):
    """The root's wrong-sized root-only buffer: the root raises InvalidArgumentError; every
    other rank raises PeerError quoting the root's text within seconds (timeout 120 s), and
    the communicator is broken everywhere (the next call fails too)."""
    res = run_ranks(3, _root_bad_buffer, coll, env=_env(tr), timeout=150)
    (cls0, msg0), _, _ = res[0]
    assert cls0 == "InvalidArgumentError", res
    for rank, ((cls, msg), nxt, secs) in enumerate(res):
        assert nxt[0] != "ok", res
        if rank:
            # gather/reduce non-roots only send: they may return and learn it at their next call
            if cls == "ok" and coll != "scatter":
                cls, msg = nxt
            assert cls == "PeerError" and "rank 0, the root, refused" in msg and msg0 in msg, res
            assert secs < 60, res  # not the 120 s timeout


# ---------------------------------------------------------------------------- item 12: raw pointers (NCCL API)
def _nccl_bad_pointers(rank, size):
    import ctypes
    import mmap

    from harp import nccl
    c = nccl.NcclCommunicator(size, bytes.fromhex(os.environ["HARP_UNIQUE_ID"]), rank)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page, anon = mmap.PAGESIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    ro = libc.mmap(None, page, mmap.PROT_READ, anon, -1, 0)
    half = libc.mmap(None, 2 * page, mmap.PROT_READ | mmap.PROT_WRITE, anon, -1, 0)
    libc.munmap(half + page, page)  # a range whose second page is gone
    n = page // 4
    x, y = np.ones(2 * n, np.float32), np.zeros(2 * n, np.float32)
    F, S = nccl.NCCL_FLOAT32, nccl.NCCL_SUM

    def code(fn):
        try:
            fn()
            return None
        except nccl.NcclError as e:
            return e.status, nccl.get_last_error()

    out = {
        "unmapped_send": code(lambda: c.allReduce(0x1000, y.ctypes.data, n, F, S, 0)),
        "unmapped_recv": code(lambda: c.allReduce(x.ctypes.data, 0x2000, n, F, S, 0)),
        "readonly_recv": code(lambda: c.allReduce(x.ctypes.data, ro, n, F, S, 0)),
        "half_mapped_send": code(lambda: c.allReduce(half, y.ctypes.data, 2 * n, F, S, 0)),
        "bcast_unmapped": code(lambda: c.bcast(0x3000, n, F, 0, 0)),
        "readonly_send_is_fine": code(lambda: c.allReduce(ro, y.ctypes.data, n, F, S, 0)),
    }
    c.allReduce(x.ctypes.data, y.ctypes.data, 2 * n, F, S, 0)  # still usable
    out["after"] = float(y[0]), float(y[-1])
    c.destroy()
    return out


@pytest.mark.parametrize("tr", TRANSPORTS)
def test_nccl_api_refuses_unmapped_and_read_only_pointers_by_name(tr):
    """Raw pointers through the NCCL API: unmapped (wholly or in part) or read-only where
    written gives ncclInvalidArgument naming the buffer and the address, on every transport,
    instead of a SIGSEGV in the shm copy or the reduce kernel; the communicator stays usable."""
    from harp import nccl
    res = run_ranks(2, _nccl_bad_pointers, env=_env(tr), timeout=120)
    inv = nccl.NCCL_INVALID_ARGUMENT
    for out in res:
        assert out["unmapped_send"][0] == inv and "bad local send buffer" in out["unmapped_send"][1], out
        assert "[0x1000" in out["unmapped_send"][1], out
        assert out["unmapped_recv"][0] == inv and "bad local receive buffer" in out["unmapped_recv"][1], out
        assert "[0x2000" in out["unmapped_recv"][1], out
        assert out["readonly_recv"][0] == inv and "not writable" in out["readonly_recv"][1], out
        assert out["half_mapped_send"][0] == inv and "not mapped" in out["half_mapped_send"][1], out
        assert out["bcast_unmapped"][0] == inv and "0x3000" in out["bcast_unmapped"][1], out
        assert out["readonly_send_is_fine"] is None, out
        assert out["after"] == (2.0, 2.0), out
