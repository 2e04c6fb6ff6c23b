"""Per-call latency of every collective (2 ranks, small messages, tcp and shm) and the
Python entry cost, with pytest-benchmark — and a check of every result.

Regression tracking (saved JSON under .benchmarks/, compared run to run):

    PYTHONPATH=python python3 -m pytest tests/test_perf.py --benchmark-only --benchmark-autosave
    ... change something, rebuild ...
    PYTHONPATH=python python3 -m pytest tests/test_perf.py --benchmark-only \\
        --benchmark-compare --benchmark-compare-fail=median:25%
    pytest-benchmark compare --group-by=param:transport      # tables of saved runs
    --benchmark-json FILE                                    # one run's JSON anywhere

CI runs this file with --benchmark-disable: each benchmarked call then runs once and
its result is still checked (quick mode; no timing is asserted anywhere).

How two ranks share one benchmark: this pytest process is rank 0; rank 1 is a
helper process (tests/perf_helper.py) that waits for a command broadcast by rank 0 —
(collective, count, calls) — then makes exactly `calls` matching calls, checks
its own results with numpy and writes its wrong-value count to a file that rank 0
reads after a barrier (never through the library measured); rank 0 checks its own.
`calls` is known up front because the benchmarks run in pedantic mode (fixed
rounds x iterations, so a known upper bound; rank 0 pads with untimed calls up to
it; one call when benchmarking is disabled).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import harp

pytest.importorskip("pytest_benchmark")

from perf_helper import COLLS, buffers, call, wrong

SIZES = [8, 4096]  # bytes per rank (float32)
ROUNDS, ITERS, WARMUP = 15, 40, 2
STOP = -1
HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "perf_helper.py")


def env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


class Pair:
    """Rank 0's side: the communicator, the transport, rank 1's report folder and command count."""

    def __init__(self, comm, transport, folder):
        self.comm, self.transport, self.folder, self.commands = comm, transport, folder, 0

    def rank1_wrong(self):
        """Rank 1's wrong-value count for the last command (after the barrier that follows its write)."""
        self.comm.barrier()
        path = os.path.join(self.folder, f"wrong{self.commands}")
        self.commands += 1
        with open(path) as f:
            return int(f.read())


@pytest.fixture(scope="module", params=["tcp", "shm"])
def pair(request, tmp_path_factory):
    """Pair with rank 1 running tests/perf_helper.py."""
    uid = harp.get_unique_id("127.0.0.1:0")
    folder = str(tmp_path_factory.mktemp("perf-" + request.param))
    helper = subprocess.Popen([sys.executable, HELPER], env=dict(env(), PERF_UID=uid.hex(), PERF_DIR=folder,
                                                                      PERF_TRANSPORT=request.param))
    comm = harp.Communicator(0, 2, uid, transport=request.param)
    p = Pair(comm, request.param, folder)
    yield p
    comm.broadcast(np.array([STOP, 0, 0], np.int64), root=0)
    comm.destroy()
    assert helper.wait(timeout=120) == 0


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("coll", COLLS)
def test_collective_latency(benchmark, pair, coll, nbytes):
    comm, transport = pair.comm, pair.transport
    assert comm.transport(1) == transport
    n = nbytes // 4
    send, out = buffers(coll, n, 0, 2)
    # Rank 1 makes `calls` calls: an upper bound on what pedantic mode makes (rounds and
    # warm-up x iterations, + 1 for the result, + ITERS if --benchmark-cprofile);
    # rank 0 pads with untimed calls up to it.
    calls = 1 if benchmark.disabled else (ROUNDS + WARMUP + 1) * ITERS + 1
    comm.broadcast(np.array([COLLS.index(coll), n, calls], np.int64), root=0)
    made = []

    def one():
        made.append(1)
        call(comm, coll, send, out)

    benchmark.group = f"{coll} {nbytes}B"
    benchmark.extra_info.update(transport=transport, nbytes=nbytes, ranks=2)
    benchmark.pedantic(one, rounds=1 if benchmark.disabled else ROUNDS, iterations=ITERS, warmup_rounds=WARMUP)
    assert 1 <= len(made) <= calls
    for _ in range(calls - len(made)):
        call(comm, coll, send, out)
    mine, theirs = wrong(comm, coll, send, out), pair.rank1_wrong()
    assert (mine, theirs) == (0, 0), f"{coll} {nbytes} B over {transport}: wrong values: rank 0 {mine}, rank 1 {theirs}"


@pytest.fixture(scope="module")
def solo():
    comm = harp.Communicator(0, 1, harp.get_unique_id("127.0.0.1:0"))
    yield comm
    comm.destroy()


def test_python_entry_cost(benchmark, solo):
    """comm.allreduce(x, out) on a 1-rank communicator: the Python -> C++ entry and
    return, with no communication (the ~0.3 us fast path)."""
    x = np.arange(1, 3, dtype=np.float32)
    out = np.zeros_like(x)
    benchmark.group = "python entry"
    benchmark(solo.allreduce, x, out)
    assert out.tolist() == [1.0, 2.0]


def test_python_entry_cost_numpy_baseline(benchmark):
    """The same-shaped numpy call (np.copyto), to read the entry cost against."""
    x = np.arange(1, 3, dtype=np.float32)
    out = np.zeros_like(x)
    benchmark.group = "python entry"
    benchmark(np.copyto, out, x)
    assert out.tolist() == [1.0, 2.0]
