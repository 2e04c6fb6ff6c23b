"""The simulator's schedules (bench/sim/) are HARP's algorithms' own messages.

harp_sched (bench/sim/emit/) runs core/algorithms/*.cc with a recording
Context; these checks compare what it records with the algorithms' stated
costs (the comments atop each file) and with per-pair FIFO matching, and
replay one schedule on a zero-latency SimGrid platform (skipped where the
system python3 has no simgrid: scripts/install-deps.sh --sim).
"""

import collections
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench/sim"))
import schedule  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler for harp_sched")

N = 1 << 20  # bytes, float32: divisible by every p below


def matched(s):
    """Every pair's sends, in order, have the sizes of the receives its peer posted, in order."""
    sends, recvs = collections.defaultdict(list), collections.defaultdict(list)
    for r, ops in enumerate(s.ranks):
        for op in ops:
            if op[0] == "S":
                sends[(r, op[2], op[4])].append(op[3])
            elif op[0] == "V":
                recvs[(op[2], r, op[4])].append(op[3])
    return sends == recvs


def waited(s):
    """Every request is waited for exactly once."""
    for ops in s.ranks:
        posted = [op[1] for op in ops if op[0] in "SV"]
        waits = [i for op in ops if op[0] == "W" for i in op[1]]
        if sorted(posted) != sorted(waits):
            return False
    return True


@pytest.mark.parametrize("p", [5, 8])
def test_ring_moves_its_stated_bytes(p):
    s = schedule.emit("ring", p, N)
    assert matched(s) and waited(s)
    assert sum(s.sent(r) for r in range(p)) == 2 * (p - 1) * N
    for r in range(p):
        assert abs(s.sent(r) - 2 * (p - 1) / p * N) <= 8 * (p - 1)  # chunks differ by one element
        assert abs(s.work(r, "reduce") - (p - 1) / p * N) <= 4 * (p - 1)


def test_recursive_doubling_sends_the_whole_vector_per_round():
    p = 8
    s = schedule.emit("recursive_doubling", p, N)
    assert matched(s) and waited(s)
    assert all(s.sent(r) == math.log2(p) * N and s.work(r, "reduce") == math.log2(p) * N for r in range(p))


def test_recursive_doubling_folds_non_powers_of_two():
    s = schedule.emit("recursive_doubling", 6, N)  # 2 extra ranks hand their vector in and get it back
    assert matched(s) and waited(s)
    assert sorted(s.sent(r) for r in range(6)) == [N, N, 2 * N, 2 * N, 3 * N, 3 * N]


def test_halving_doubling_is_bandwidth_optimal():
    p = 8
    s = schedule.emit("halving_doubling", p, N)
    assert matched(s) and waited(s)
    assert all(s.sent(r) == 2 * (p - 1) * N // p for r in range(p))


def test_tree_and_leader_and_fp16_match_pairwise():
    for s in (schedule.emit("tree", 12, N), schedule.emit("leader", 16, N, hosts=4),
              schedule.emit(None, 6, N, compress="fp16")):
        assert matched(s) and waited(s), s.header


def test_leader_crosses_hosts_only_from_leaders():
    p, hosts = 16, 4
    s = schedule.emit("leader", p, 8, hosts=hosts)
    inter = {r for r, ops in enumerate(s.ranks) for op in ops if op[0] == "S" and op[2] // 4 != r // 4}
    assert inter == {0, 4, 8, 12}
    assert all(op[4] == 2 for r in inter for op in s.ranks[r] if op[0] == "S" and op[2] // 4 != r // 4)


def test_fp16_ring_sends_half_the_dense_ring():
    p = 4
    dense, narrow = schedule.emit("ring", p, N), schedule.emit(None, p, N, compress="fp16")
    assert all(2 * narrow.sent(r) == dense.sent(r) for r in range(p))


def test_bad_input_is_named():
    out = subprocess.run([str(schedule.ensure_built()), "--algo", "nosuch", "--p", "4", "--bytes", "64"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "no allreduce 'nosuch'" in out.stderr
    out = subprocess.run([str(schedule.ensure_built()), "--compress", "topk:0.1", "--p", "4", "--bytes", "64"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "top-k" in out.stderr


def _has_simgrid():
    return subprocess.run(["/usr/bin/python3", "-c", "import simgrid"], capture_output=True).returncode == 0


@pytest.mark.skipif(not Path("/usr/bin/python3").exists() or not _has_simgrid(), reason="no python3-simgrid")
def test_replay_on_an_ideal_network_takes_bytes_over_rate():
    code = (
        "import sys; sys.path.insert(0, 'bench/sim'); import platforms, replay, schedule\n"
        f"s = schedule.emit('ring', 4, {16 * N}, 4)\n"
        "spec = platforms.Spec(hosts=4, link_Bps=1e8, rtt_s=0, shm_lat_s=0, reduce_Bps=1e15, send_overhead_s=0)\n"
        "print(replay.simulate(s, spec))\n")
    out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    t = float(out.stdout.split()[-1])
    ideal = 2 * 3 / 4 * 16 * N / 1e8  # each rank's uplink carries 2(p-1)/p n bytes
    assert ideal <= t * (1 + 1e-6) and t < ideal * 1.05, (t, ideal)
