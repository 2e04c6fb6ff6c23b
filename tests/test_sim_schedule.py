"""The simulator's schedules (bench/sim/) are HARP's algorithms' own messages.

harp_sched (bench/sim/emit/) runs core/algorithms/*.cc with a recording
Context; these checks compare what it records with the algorithms' stated
costs (the comments atop each file) and with per-pair FIFO matching, and
replay one schedule on a zero-latency SimGrid platform (skipped where the
system python3 has no simgrid: scripts/install-deps.sh --sim).
"""

import collections
import dataclasses
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
    """Every request is waited for exactly once (a lane's jobs included)."""
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


@pytest.mark.parametrize("p", [6, 8])
def test_allgather_reduce_scatter_alltoall_rings_move_their_stated_bytes(p):
    n = 4096  # each rank's block
    ag = schedule.emit("ring", p, n, extra=("--coll", "allgather"))
    rs = schedule.emit("ring", p, n, extra=("--coll", "reduce_scatter"))
    a2a = schedule.emit("pairwise", p, n, extra=("--coll", "alltoall"))
    for s in (ag, rs, a2a):
        assert matched(s) and waited(s), s.header
        assert all(s.sent(r) == (p - 1) * n for r in range(p)), s.header
    assert all(rs.work(r, "reduce") == (p - 1) * n for r in range(p))


def test_log_step_collectives_take_log_steps():
    p, n = 16, 256
    for coll, algo in (("allgather", "bruck"), ("allgather", "recursive_doubling"), ("reduce_scatter", "bruck"),
                       ("reduce_scatter", "recursive_halving"), ("alltoall", "bruck")):
        s = schedule.emit(algo, p, n, extra=("--coll", coll))
        assert matched(s) and waited(s), (coll, algo)
        assert all(sum(op[0] == "S" for op in ops) == 4 for ops in s.ranks), (coll, algo)  # log2 16


def test_copies_are_recorded_not_made():
    """harp_sched's buffers are reserved address space: a 64-rank allgather of 4 MB blocks (256 MB
    of output per rank) records its copies as X lines and never faults the buffers in."""
    out = subprocess.run(["/usr/bin/time", "-f", "%M", str(schedule.ensure_built()), "--coll", "allgather", "--algo",
                          "ring", "--p", "64", "--bytes", str(4 << 20)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    s = schedule.parse(out.stdout)
    assert all(s.work(r, "copy") == 4 << 20 for r in range(64))  # its own block into place
    assert int(out.stderr.split()[-1]) < 200 * 1024, out.stderr  # max RSS in KB: far below one 256 MB buffer


def test_rail_runs_its_network_legs_on_a_lane():
    s = schedule.emit("rail", 16, 64 << 20, hosts=4)
    jobs = [op for ops in s.ranks for op in ops if op[0] == "A"]
    joins = [op for ops in s.ranks for op in ops if op[0] == "J"]
    assert jobs and sorted(jobs) == sorted(("A", j[1]) for j in joins)
    assert matched(s)


def test_pick_is_the_selector_the_library_runs():
    """harp_sched --pick links core/select: it agrees with harp-config --explain (libharp)."""
    harp_config = pytest.importorskip("harp.tools.config")
    for coll, size, ppn in (("allreduce", 8, [2, 2]), ("allreduce", 32 << 20, [2, 2]), ("allreduce", 65536, [8] * 8),
                            ("allgather", 4096, [8] * 16), ("reduce_scatter", 1 << 20, [8] * 8),
                            ("alltoall", 64, [1] * 8)):
        want = [x for x in harp_config.explain(coll, str(size), sum(ppn), "mixed" if ppn[0] > 1 else "tcp", ppn=ppn)
                if x.startswith("pick: ")][0].split()[1]
        got = subprocess.run([str(schedule.ensure_built()), "--pick", "--coll", coll, "--p", str(sum(ppn)), "--hosts",
                              str(len(ppn)), "--bytes", str(size)], capture_output=True, text=True, check=True)
        assert got.stdout.split()[1] == want, (coll, size, ppn, got.stdout)


def _has_simgrid():
    return subprocess.run(["/usr/bin/python3", "-c", "import simgrid"], capture_output=True).returncode == 0


def _has_simgrid_dev():
    return Path("/usr/include/simgrid/s4u.hpp").exists()


needs_both = pytest.mark.skipif(not Path("/usr/bin/python3").exists() or not _has_simgrid() or not _has_simgrid_dev(),
                                reason="needs python3-simgrid and libsimgrid-dev (scripts/install-deps.sh --sim)")


def _in_system_python(lines, timeout=300):
    """Runs `lines` (after importing bench/sim's platforms, replay and schedule) in the system
    python3, where SimGrid's bindings live; the floats its last printed line holds."""
    code = "import sys; sys.path.insert(0, 'bench/sim'); import platforms, replay, schedule\n" + "\n".join(lines) + "\n"
    out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return [float(x) for x in out.stdout.splitlines()[-1].split()]


@needs_both
@pytest.mark.parametrize("engine", ["python", "cpp"])
def test_replay_on_an_ideal_network_takes_bytes_over_rate(engine):
    (t,) = _in_system_python([
        f"s = schedule.emit('ring', 4, {16 * N}, 4)",
        "spec = platforms.Spec(hosts=4, link_Bps=1e8, rtt_s=0, shm_lat_s=0, reduce_Bps=1e15, send_overhead_s=0)",
        f"print(replay.simulate(s, spec, engine={engine!r}))"])
    ideal = 2 * 3 / 4 * 16 * N / 1e8  # each rank's uplink carries 2(p-1)/p n bytes
    assert ideal <= t * (1 + 1e-6) and t < ideal * 1.05, (t, ideal)


def _two_sends(comms):
    """Rank 0 (host 0) sends rank 1 (host 1) two 8 MB messages posted together, on the connection
    sets `comms`."""
    n = 8 << 20
    lines = ["# harp-schedule 1 coll=test algo=two-sends p=2 bytes=8388608 hosts=2", "R 0"]
    lines += [f"S {i} 1 {n} {c}" for i, c in enumerate(comms)] + ["W 0 1", "R 1"]
    lines += [f"V {i} 0 {n} {c}" for i, c in enumerate(comms)] + ["W 0 1"]
    return schedule.parse("\n".join(lines) + "\n"), n


@needs_both
@pytest.mark.parametrize("engine", ["python", "cpp"])
def test_one_connections_messages_share_its_flow_cap(engine):
    """One TCP stream per pair: two messages in flight together on one connection take the per-flow
    cap once between them (2 n / cap), on two connections once each (n / cap); the NIC is 4 x the cap."""
    import platforms  # noqa: PLC0415

    cap = 1.25e8
    spec = platforms.Spec(hosts=2, link_Bps=4 * cap, flow_cap_Bps=cap, rtt_s=1e-4, shm_lat_s=0, reduce_Bps=1e15,
                          send_overhead_s=0)
    same, other = _two_sends((0, 0))[0].text, _two_sends((0, 1))[0].text
    one, two = _in_system_python([
        f"spec = platforms.Spec(**{dataclasses.asdict(spec)!r})",
        f"print(replay.simulate(schedule.parse({same!r}), spec, engine={engine!r}), "
        f"replay.simulate(schedule.parse({other!r}), spec, engine={engine!r}))"])
    n = _two_sends((0,))[1]
    assert 2 * n / cap <= one * (1 + 1e-6) and one < 2 * n / cap * 1.02 + 1e-3, (one, 2 * n / cap)
    assert n / cap <= two * (1 + 1e-6) and two < n / cap * 1.02 + 1e-3, (two, n / cap)


@needs_both
@pytest.mark.parametrize("engine", ["python", "cpp"])
def test_the_timed_mean_starts_after_the_warm_up(engine):
    """A benchmark's loop: rank 0 sends 64 KB to rank 1 per call through a tbf bucket of 256 KB
    at 10 x the link rate. The first calls pass on the bucket's tokens; once drained, a call
    takes 64 KB at the link rate. Timed after 5 warm-up calls (--warmup 5) the mean is the link
    rate's; after 1 (the default) it includes the three still on tokens, and is faster."""
    import platforms  # noqa: PLC0415

    n, link = 65536, 119.6e6
    text = f"# harp-schedule 1 coll=test algo=send p=2 bytes={n} hosts=2\nR 0\nS 0 1 {n} 0\nW 0\nR 1\nV 0 0 {n} 0\nW 0\n"
    spec = platforms.Spec(hosts=2, link_Bps=link, rtt_s=0, send_overhead_s=0, burst_B=262144, burst_Bps=10 * link)
    warm5, warm1, default = _in_system_python([
        f"spec = platforms.Spec(**{dataclasses.asdict(spec)!r})",
        f"s = schedule.parse({text!r})",
        f"print(*(replay.simulate(s, spec, iterations=20, warmup=w, engine={engine!r}) for w in (5, 1, None)))"])
    assert warm5 == pytest.approx(n / link, rel=0.02), (warm5, n / link)
    assert warm1 < 0.9 * warm5, (warm1, warm5)
    assert default == warm1
    import replay  # noqa: PLC0415

    with pytest.raises(ValueError, match="warmup 3 must be 0 .. iterations - 1"):
        replay.warmup_of(3, 3)


@needs_both
@pytest.mark.parametrize("engine", ["python", "cpp"])
def test_a_send_the_socket_buffer_takes_is_done_when_posted(engine):
    """Spec.sndbuf_B: rank 0 sends rank 1 two messages, waiting for each send before the next (a
    fold's hand-off, then the next call's). With sends done on arrival that takes two one-way
    latencies; done once the socket buffer took them (HARP's tcp isend), both leave at once and
    the last arrives one latency after it was posted. A message over sndbuf_B still waits."""
    import platforms  # noqa: PLC0415

    def two(n):
        return (f"# harp-schedule 1 coll=test algo=send p=2 bytes={n} hosts=2\n"
                f"R 0\nS 0 1 {n} 0\nW 0\nS 1 1 {n} 0\nW 1\nR 1\nV 0 0 {n} 0\nV 1 0 {n} 0\nW 0 1\n")
    one_way = 5e-4
    spec = platforms.Spec(hosts=2, link_Bps=1e9, rtt_s=2 * one_way, send_overhead_s=0)
    arrive, buffered, big = _in_system_python([
        f"spec = platforms.Spec(**{dataclasses.asdict(spec)!r})",
        f"print(*(replay.simulate(schedule.parse(t), spec.but(sndbuf_B=b), engine={engine!r}) "
        f"for t, b in (({two(8)!r}, 0), ({two(8)!r}, 16384), ({two(65536)!r}, 16384))))"])
    assert arrive == pytest.approx(2 * one_way, rel=0.01), arrive
    assert buffered == pytest.approx(one_way, rel=0.01), buffered
    assert big > 2 * one_way + 2 * 65536 / 1e9 * 0.99, big


# Schedules and platforms both replayers see: the arena (tbf bucket, 3 back-to-back iterations,
# 1 rank per host) and the VPC (8 ranks per host, split-duplex NICs, per-flow cap).
AGREE = [
    ("ring", 4, 1 << 20, 4, dict(hosts=4, link_Bps=119.6e6, rtt_s=1.042e-3, send_overhead_s=30e-6, burst_B=262144,
                                  burst_Bps=1.25e9), 3),
    ("halving_doubling", 8, 1 << 16, 8, dict(hosts=8, link_Bps=119.6e6, rtt_s=42e-6, send_overhead_s=30e-6,
                                              burst_B=262144, burst_Bps=1.25e9), 3),
    ("ring", 16, 16 << 20, 2, dict(hosts=2, local=8, link_Bps=3.125e9, flow_cap_Bps=1.25e9, rtt_s=1e-4,
                                    send_overhead_s=30e-6), 1),
    ("recursive_doubling", 16, 1 << 20, 2, dict(hosts=2, local=8, link_Bps=3.125e9, flow_cap_Bps=1.25e9, rtt_s=1e-3,
                                                 send_overhead_s=30e-6), 1),
    ("leader", 32, 65536, 4, dict(hosts=4, local=8, link_Bps=3.125e9, flow_cap_Bps=1.25e9, rtt_s=1e-4,
                                  send_overhead_s=30e-6), 1),
    ("tree", 32, 4 << 20, 4, dict(hosts=4, local=8, link_Bps=3.125e9, flow_cap_Bps=1.25e9, rtt_s=1e-3,
                                  send_overhead_s=30e-6), 1),
]


@needs_both
@pytest.mark.parametrize("algo,p,n,hosts,spec,its", AGREE, ids=[f"{a[0]}-{a[1]}" for a in AGREE])
def test_cpp_replayer_agrees_with_the_python_reference(algo, p, n, hosts, spec, its):
    """harp_replay (C++ S4U) against replay.py (Python bindings) on identical schedules and platforms: the
    same model, so the same time (the per-flow cap is a FATPIPE link in Python, a flow bound in C++)."""
    py, cpp = _in_system_python([
        f"s = schedule.emit({algo!r}, {p}, {n}, {hosts})",
        f"spec = platforms.Spec(**{spec!r})",
        f"print(replay.simulate(s, spec, iterations={its}, engine='python'), "
        f"replay.simulate(s, spec, iterations={its}, engine='cpp'))"], timeout=600)
    assert abs(cpp / py - 1) < 1e-6, (py, cpp)



def _ring_of_one_message(p):
    """Every rank sends its right neighbour 8 bytes and receives from its left one, all at once."""
    lines = [f"# harp-schedule 1 coll=test algo=shift p={p} bytes=8 hosts={p}"]
    for r in range(p):
        lines += [f"R {r}", f"S 0 {(r + 1) % p} 8 0", f"V 1 {(r - 1) % p} 8 0", "W 0 1"]
    return "\n".join(lines) + "\n"


def _replay_text(text, spec, tmp_path):
    import replay  # noqa: PLC0415

    path = tmp_path / "s.sched"
    path.write_text(text)
    return replay.simulate_file(str(path), spec)


@pytest.mark.skipif(not _has_simgrid_dev(), reason="needs libsimgrid-dev (scripts/install-deps.sh --sim)")
def test_shared_cores_queue_the_ranks_cpu_work(tmp_path):
    """Spec.cores: 4 ranks each spend 1 ms posting one message at once; on c shared cores that takes
    4 / c ms (each rank its own core: 1 ms)."""
    import platforms  # noqa: PLC0415

    base = platforms.Spec(hosts=4, link_Bps=1e9, rtt_s=0, shm_lat_s=0, send_overhead_s=1e-3)
    for cores, want in ((0, 1e-3), (1, 4e-3), (2, 2e-3), (4, 1e-3)):
        t = _replay_text(_ring_of_one_message(4), base.but(cores=cores), tmp_path)["sim_seconds"]
        assert want <= t < want + 1e-4, (cores, t, want)


@pytest.mark.skipif(not _has_simgrid_dev(), reason="needs libsimgrid-dev (scripts/install-deps.sh --sim)")
def test_a_blocked_wait_on_oversubscribed_cores_pays_the_wake_up(tmp_path):
    """Spec.wake_s: rank 0 pings rank 1; rank 1 waits for the ping, pongs, works 1 ms and waits
    for its pong's send. With 4 ranks on 2 cores a wait that blocks (rank 1's for the ping) ends
    wake_s x (4 - 2) / 2 late; its wait for the send, done long before, ends at once (else the
    run would take two wake-ups longer, not one); on 4 cores nothing is added."""
    import platforms  # noqa: PLC0415

    text = ("# harp-schedule 1 coll=test algo=pingpong p=4 bytes=8 hosts=1\n"
            "R 0\nS 0 1 8 0\nV 1 1 8 0\nW 0 1\nR 1\nV 0 0 8 0\nW 0\nS 1 0 8 0\nX copy 3000000\nW 1\nR 2\nR 3\n")
    base = platforms.Spec(hosts=1, local=4, send_overhead_s=0, shm_lat_s=1e-6)
    times = {(c, w): _replay_text(text, base.but(cores=c, wake_s=w), tmp_path)["sim_seconds"]
             for c in (2, 4) for w in (0.0, 1e-4)}
    assert times[(2, 1e-4)] - times[(2, 0.0)] == pytest.approx(1e-4, rel=1e-6), times
    assert times[(4, 1e-4)] == pytest.approx(times[(4, 0.0)], rel=1e-9), times


@pytest.mark.skipif(not _has_simgrid_dev(), reason="needs libsimgrid-dev (scripts/install-deps.sh --sim)")
def test_a_run_queue_charges_a_wake_up_only_the_cores_in_use(tmp_path):
    """Spec.runq: the ping-pong above with 8 ranks on 2 cores. The fixed wait charges rank 1's
    blocked wait wake_s x (8 - 2) / 2 whether or not the cores are busy; on the run queue the
    wake-up is wake_s of CPU on a free core (the other 6 ranks are idle), so it adds wake_s."""
    import platforms  # noqa: PLC0415

    text = ("# harp-schedule 1 coll=test algo=pingpong p=8 bytes=8 hosts=1\n"
            "R 0\nS 0 1 8 0\nV 1 1 8 0\nW 0 1\nR 1\nV 0 0 8 0\nW 0\nS 1 0 8 0\nX copy 3000000\nW 1\n"
            + "".join(f"R {r}\n" for r in range(2, 8)))
    base = platforms.Spec(hosts=1, local=8, send_overhead_s=0, shm_lat_s=1e-6, cores=2)
    t = {(q, w): _replay_text(text, base.but(runq=q, wake_s=w), tmp_path)["sim_seconds"]
         for q in (0, 1) for w in (0.0, 1e-4)}
    assert t[(0, 1e-4)] - t[(0, 0.0)] == pytest.approx(3e-4, rel=1e-6), t
    # (rank 0's own wake-up for the pong ends long before rank 1's 1 ms of work)
    assert t[(1, 1e-4)] - t[(1, 0.0)] == pytest.approx(1e-4, rel=1e-6), t


@pytest.mark.skipif(not _has_simgrid_dev(), reason="needs libsimgrid-dev (scripts/install-deps.sh --sim)")
def test_a_run_queue_takes_wake_ups_that_meet_in_turn(tmp_path):
    """Spec.runq: ranks 4-7 each send rank r - 4 a message; the four arrive at once (one-way L),
    and each woken rank needs wake_s (1 ms) of CPU, then answers; ranks 4-7 wake to the answers.
    On 2 cores the first two wake-ups end at L + 1 ms, the next two at L + 2 ms, so their answers
    wake ranks 4-7 two at a time too: 2 L + 3 ms. Cores shared by all (the four wake-ups ending
    together at L + 2, their four answers' wake-ups together 2 ms later) would take 2 L + 4 ms;
    on 4 cores, 2 L + 2 ms."""
    import platforms  # noqa: PLC0415

    lines = ["# harp-schedule 1 coll=test algo=answer p=8 bytes=8 hosts=8"]
    for r in range(4):
        lines += [f"R {r}", f"V 0 {r + 4} 8 0", "W 0", f"S 1 {r + 4} 8 0", "W 1"]
    for r in range(4, 8):
        lines += [f"R {r}", f"S 0 {r - 4} 8 0", f"V 1 {r - 4} 8 0", "W 0 1"]
    text = "\n".join(lines) + "\n"
    one_way = 10e-3
    # (sndbuf_B: a send is done once posted, so only the waits for messages block)
    base = platforms.Spec(hosts=8, link_Bps=1e12, rtt_s=2 * one_way, shm_lat_s=0, send_overhead_s=0,
                          wake_s=1e-3, runq=1, sndbuf_B=1024)
    for cores, want in ((2, 2 * one_way + 3e-3), (4, 2 * one_way + 2e-3)):
        t = _replay_text(text, base.but(cores=cores), tmp_path)["sim_seconds"]
        assert t == pytest.approx(want, abs=1e-5), (cores, t, want)
    with pytest.raises(Exception, match="runq needs cores"):
        _replay_text(text, base.but(cores=0), tmp_path)


@pytest.mark.skipif(not _has_simgrid_dev(), reason="needs libsimgrid-dev (scripts/install-deps.sh --sim)")
def test_a_large_message_moves_once_its_receive_is_posted(tmp_path):
    """Spec.rendezvous_B: ranks 0 and 2 each send rank 1 100 MB at once; rank 1 takes rank 0's
    first, then sends rank 0 100 MB and only then posts its receive from rank 2 (1 GB/s links).
    Eager, rank 2's bytes share rank 1's link with rank 0's: rank 0's arrive at 0.2 s, and rank
    1's answer at 0.3. With a rendezvous rank 2's wait for the receive: 0.1, then the answer and
    rank 2's message side by side on different links: 0.2 s."""
    import platforms  # noqa: PLC0415

    mb = 100_000_000
    text = (f"# harp-schedule 1 coll=test algo=early p=3 bytes={mb} hosts=3\n"
            f"R 0\nS 0 1 {mb} 0\nV 1 1 {mb} 0\nW 0 1\n"
            f"R 1\nV 0 0 {mb} 0\nW 0\nS 1 0 {mb} 0\nV 2 2 {mb} 0\nW 1 2\n"
            f"R 2\nS 0 1 {mb} 0\nW 0\n")
    base = platforms.Spec(hosts=3, link_Bps=1e9, rtt_s=0, shm_lat_s=0, send_overhead_s=0, tcp_window_B=1e12)
    eager = _replay_text(text, base, tmp_path)["sim_seconds"]
    rdv = _replay_text(text, base.but(rendezvous_B=1 << 20), tmp_path)["sim_seconds"]
    assert eager == pytest.approx(0.3, rel=1e-3), eager
    # (SimGrid's cross traffic: the answer's acknowledgements share rank 1's link, 5% of its bytes)
    assert rdv == pytest.approx(0.2, rel=0.03), rdv
    # through the arena's buckets (1 MB deep, refilled at the link's 1 GB/s, drained at 10): a
    # large message is charged when its receive is posted; each waits out its 99 MB of debt (0.099 s)
    # and drains in 0.01: rank 0's by 0.109, the answer and rank 2's side by side by 0.218
    shaped = base.but(link_Bps=1e9, burst_B=1e6, burst_Bps=1e10, rendezvous_B=1 << 20)
    assert _replay_text(text, shaped, tmp_path)["sim_seconds"] == pytest.approx(0.218, rel=0.01)


@pytest.mark.skipif(not _has_simgrid_dev(), reason="needs libsimgrid-dev (scripts/install-deps.sh --sim)")
def test_a_schedule_that_deadlocks_is_an_error_not_a_time(tmp_path):
    """A receive no one sends to: SimGrid ends the run quietly; the replayer must say so, not print 0 s."""
    import platforms  # noqa: PLC0415

    text = _ring_of_one_message(3).replace("V 1 1 8 0", "V 1 0 8 0")  # rank 2 waits on rank 0, which sends to 1
    with pytest.raises(RuntimeError, match=r"2 rank\(s\) never finished: 1 in iteration 1, 2 in iteration 1"):
        _replay_text(text, platforms.Spec(hosts=3), tmp_path)


@pytest.mark.parametrize("n,want", [(8, 7 * 64), (4096, 7 * 4096), (N, 2 * 7 * N // 8)])
def test_the_shm_transports_allreduce_is_traced_as_the_reads_it_makes(n, want):
    """bench/sim/emit/trace_shm.cc: the table's `allreduce shm` row (rail's tail, leader's legs) is
    replayable: tiny vectors read a cache line of each peer, small ones each peer's vector, larger
    ones a slice of each peer's (reduce-scatter) and each peer's reduced slice (allgather)."""
    s = schedule.emit("shm", 8, n, 1)
    assert matched(s) and waited(s)
    assert all(s.sent(r) == want for r in range(8)), [s.sent(r) for r in range(8)]
    assert s.work(0, "reduce") == (7 * n if n <= 16384 else 7 * n // 8)
    rail = schedule.emit("rail", 16, 8, 2)  # its 2 floats of tail take the intra allreduce: the shm row
    assert matched(rail) and waited(rail)


@needs_both
@pytest.mark.parametrize("engine", ["python", "cpp"])
def test_shm_receiver_copies_so_concurrent_sends_do_not_share_the_senders_rate(engine):
    """HARP's shm receiver copies (out of the ring, or from the sender's memory by
    process_vm_readv): rank 0 sending 16 MB to each of its three host-mates at once (a binomial
    broadcast's root) takes one message's time, 2 ms at 8 GB/s, not three's; rank 0 receiving
    16 MB from each of them at once (a gather's root) takes three's, 6 ms."""
    import platforms  # noqa: PLC0415

    n = 16777216
    sends = ("# harp-schedule 1 coll=test algo=fan p=4 bytes=8 hosts=1\n"
             f"R 0\nS 0 1 {n} 0\nS 1 2 {n} 0\nS 2 3 {n} 0\nW 0 1 2\n" +
             "".join(f"R {r}\nV 0 0 {n} 0\nW 0\n" for r in (1, 2, 3)))
    recvs = ("# harp-schedule 1 coll=test algo=fan p=4 bytes=8 hosts=1\n"
             f"R 0\nV 0 1 {n} 0\nV 1 2 {n} 0\nV 2 3 {n} 0\nW 0 1 2\n" +
             "".join(f"R {r}\nS 0 0 {n} 0\nW 0\n" for r in (1, 2, 3)))
    spec = platforms.Spec(hosts=1, local=4, send_overhead_s=0, shm_Bps=8e9, shm_lat_s=1e-6)
    t_send, t_recv = _in_system_python([
        f"spec = platforms.Spec(**{dataclasses.asdict(spec)!r})",
        f"print(*(replay.simulate(schedule.parse(t), spec, engine={engine!r}) for t in {(sends, recvs)!r}))"])
    one = n / 8e9 + 1e-6
    assert one <= t_send * (1 + 1e-6) and t_send < one * 1.02, (t_send, one)
    assert 3 * n / 8e9 <= t_recv * (1 + 1e-6) and t_recv < 3 * n / 8e9 * 1.02, t_recv


@needs_both
@pytest.mark.parametrize("engine", ["python", "cpp"])
def test_a_ranks_network_flow_does_not_share_its_memory_link(engine):
    """Rank 0 sends 16 MB to its host's other rank (shm, 8 GB/s: 2 ms) and 8 MB to another host
    (1.25 GB/s: 6.7 ms) at once. The network message leaves through the rank's own port, so it
    takes 6.7 ms whatever the shm flow does; sharing the memory link (CM02 favours the 1 us shm
    flow 50 to 1 over the 50 us network flow) made it 8.2 ms."""
    import platforms  # noqa: PLC0415

    text = ("# harp-schedule 1 coll=test algo=two p=4 bytes=8 hosts=2\n"
            "R 0\nS 0 1 16777216 0\nS 1 2 8388608 0\nW 0 1\nR 1\nV 0 0 16777216 0\nW 0\n"
            "R 2\nV 0 0 8388608 0\nW 0\nR 3\n")
    spec = platforms.Spec(hosts=2, local=2, link_Bps=1.25e9, rtt_s=1e-4, send_overhead_s=0, shm_Bps=8e9)
    (t,) = _in_system_python([f"spec = platforms.Spec(**{dataclasses.asdict(spec)!r})",
                              f"print(replay.simulate(schedule.parse({text!r}), spec, engine={engine!r}))"])
    want = 8388608 / 1.25e9 + 5e-5
    assert want <= t * (1 + 1e-6) and t < want * 1.02, (t, want)
