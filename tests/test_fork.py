"""A communicator inherited through fork(): the child can neither use it nor harm the parent's job.

Each rank of a real job (forked processes, real sockets or shared memory) makes a communicator,
then forks a child, as a DataLoader worker or a multiprocessing "fork" child does. In the child:
  - every call on the inherited communicator (a collective, barrier, abort, destroy) must raise
    InvalidArgumentError naming the fork, not run on the parent's connections;
  - garbage-collecting or destroying the child's copy must not crash (it used to: destroy()
    joined the keep-alive thread, which exists only in the parent: SIGSEGV) and must not tell the
    parent's peers anything.
Then the parent ranks go on: allreduce and barrier on the same communicator give the right
answer, so nothing the children did reached the job. The same through the NCCL API
(ncclAllReduce, ncclCommFinalize, ncclCommAbort refused with ncclInvalidUsage; ncclCommDestroy
forgets the child's copy).
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import harness

TRANSPORTS = ("tcp", "shm")


def _in_child(body) -> int:
    """Fork, run body() in the child, exit with its code (0 ok, 1 wrong, 3 raised); the child's
    exit status, or -signal if it crashed."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _rank_uses_inherited(rank, size, how):
    import harp

    comm = harp.init()
    x = np.full(1001, rank + 1, np.float32)  # odd size
    comm.allreduce(x)
    errors = {}

    def use():
        for name, call in (("allreduce", lambda: comm.allreduce(np.ones(7, np.float32))),
                           ("barrier", comm.barrier),
                           ("abort", lambda: comm.abort("from a forked child"))):
            try:
                call()
                errors[name] = "returned"
            except harp.InvalidArgumentError as e:
                if "fork" not in str(e) or f"rank {rank}" not in str(e):
                    return 1
                errors[name] = "refused"
        if set(errors.values()) != {"refused"}:
            return 1
        return 0

    def drop():
        nonlocal comm
        holder = {"comm": comm}
        holder["self"] = holder  # a cycle: freed by the collector, as test harnesses' leftovers are
        comm = None
        del holder
        gc.collect()
        return 0

    def destroy():
        comm.destroy()  # the child's copy: let go, nothing sent
        return 0

    child = _in_child({"use": use, "drop": drop, "destroy": destroy}[how])
    # The parent's job goes on as if no child had been.
    y = np.full(1001, rank + 1, np.float32)
    comm.allreduce(y)
    comm.barrier()
    ok = bool(np.all(y == size * (size + 1) / 2)) and bool(np.all(x == size * (size + 1) / 2))
    comm.destroy()
    return child, ok


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("how", ("use", "drop", "destroy"))
def test_forked_child_cannot_use_or_break_an_inherited_communicator(transport, how):
    out = harness.run_ranks(3, _rank_uses_inherited, how, env={"HARP_TRANSPORT": transport, "HARP_TIMEOUT": "60"},
                            timeout=200)
    for rank, (child, ok) in enumerate(out):
        assert child == 0, f"rank {rank}: the forked child's '{how}' ended with {child} (negative: a signal)"
        assert ok, f"rank {rank}: the parent's allreduce after the child's '{how}' gave a wrong sum"


def _rank_nccl_inherited(rank, size, how):
    from harp import nccl

    comm = nccl.NcclCommunicator(size, bytes.fromhex(os.environ["HARP_UNIQUE_ID"]), rank)
    n = 513
    x = np.full(n, rank + 1, np.float32)
    comm.allReduce(x.ctypes.data, x.ctypes.data, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)

    def use():
        for call in (lambda: comm.allReduce(x.ctypes.data, x.ctypes.data, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM),
                     comm.finalize, comm.abort):
            try:
                call()
                return 1
            except nccl.NcclError as e:
                if e.status != nccl.NCCL_INVALID_USAGE or "forked" not in str(e):
                    return 1
        return 0

    def destroy():
        comm.destroy()  # ncclCommDestroy on the child's copy: forgotten, nothing joined or sent
        return 0

    child = _in_child({"use": use, "destroy": destroy}[how])
    y = np.full(n, rank + 1, np.float32)
    comm.allReduce(y.ctypes.data, y.ctypes.data, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    ok = bool(np.all(y == size * (size + 1) / 2)) and bool(np.all(x == size * (size + 1) / 2))
    comm.destroy()
    return child, ok


@pytest.mark.parametrize("how", ("use", "destroy"))
def test_forked_child_cannot_use_or_break_an_inherited_nccl_communicator(how):
    out = harness.run_ranks(3, _rank_nccl_inherited, how, env={"HARP_TRANSPORT": "tcp", "HARP_TIMEOUT": "60"},
                            timeout=200)
    for rank, (child, ok) in enumerate(out):
        assert child == 0, f"rank {rank}: the forked child's '{how}' ended with {child} (negative: a signal)"
        assert ok, f"rank {rank}: the parent's ncclAllReduce after the child's '{how}' gave a wrong sum"
