"""The arena with round-trip time, loss, slow hosts and zones (harp-cluster --delay/--loss/...;
python/harp_dev/cluster/delayline.c, a user-space switch, since this kernel has no netem).

Each test brings up its own cluster, measures what the links deliver from inside the host
namespaces (harp_dev.cluster.probe: TCP ping-pong RTT, one TCP stream, a UDP loss count) and
compares with what was asked. Tolerances are looser than the 10% bench/RESULTS-arena.md
reports on a quiet machine, because the test suite loads the same two cores; each can still
fail when the mechanism breaks (no delay: RTT ~0.08 ms; a wrong formula: off by the delay).
"""
import json
import os
import subprocess
import sys

import pytest

import netns
from harp_dev.cluster import net, topology as topo

HERE = os.path.dirname(os.path.abspath(__file__))


def _skip():
    why = netns.available()
    if why:
        pytest.skip(why)


def _name(tag):
    return f"d{tag}{os.getpid() % 100000}"[:8]


def _gone(name):
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [l for l in ns.splitlines() if l.startswith(f"hc-{name}-")]
    left += [f for f in os.listdir(topo.STATE_DIR) if f.startswith(name + ".")] if os.path.isdir(topo.STATE_DIR) else []
    return left


def test_one_ms_rtt_full_rate_and_a_tenth_percent_loss_are_delivered():
    _skip()
    name = _name("a")
    st = net.up(name, 2, rate="1gbit", mtu=9000, delay="500us", loss="0.1%")
    try:
        assert st["delay_line"] and st["rtt_asked_us"] == 1000
        # calibration takes off only the path's own cost c (at 1 ms, with every endpoint asleep between
        # packets, 220-280 us on a quiet 2-core VM: wake-ups; more under load): the line is
        # (1000 - c) / 2 us, >= 270 us while c <= 460 us; a line that added twice its delay would be
        # calibrated to (1000 - c) / 4 <= 250 us, one that adds nothing misses the RTT below
        assert 270_000 <= st["delay_line_ns"] <= 500_000, st["delay_line_ns"]
        got = net.probe(st, 0, 1, stream=2.0, udp=40000)
        # asked 1 ms; without the line it is ~0.08 ms, with a line that doubles its delay ~2 ms. Under
        # load a ping-pong's wake-ups add 0.1-0.2 ms (a CI run saw a median of 1194 us, min 1048):
        # up to two more probes of the round trip alone.
        rtts = [got["rtt_us"]["median"]]
        while not 850 <= rtts[-1] <= 1150 and len(rtts) < 3:
            rtts.append(net.probe(st, 0, 1)["rtt_us"]["median"])
        assert 850 <= rtts[-1] <= 1150, (rtts, got)
        assert got["stream_MBps"] >= 0.80 * 125, got  # 1 Gbit/s through tbf, 0.1% loss, 1 ms RTT
        assert 0.0004 <= got["udp_loss"] <= 0.0025, got  # asked 0.1% of frames
        # Offload stays on: the stream's GSO frames lose single wire segments (the line cuts a frame
        # around each lost one), at the asked share of segments, and TCP still delivers every byte.
        link = subprocess.run(["ip", "-d", "-n", topo.host_ns(name, 0), "link", "show", "eth0"], capture_output=True,
                              text=True).stdout
        assert "gso_max_segs 1 " not in link, link
        stats = _line_stats(st)
    finally:
        net.down(st)
    assert _gone(name) == []
    assert stats["gso_split"] > 0 and stats["gso_segments"] > 10 * stats["gso_split"], stats
    assert 0.0004 <= stats["gso_lost"] / stats["gso_segments"] <= 0.0025, stats  # asked 0.1%


def _line_stats(st):
    """The delay line's counters: it writes them when stopped, so stop it first (down() does again, harmlessly).
    A line stopped earlier (net.up's calibration restarts the lines) left its own file at the same path: it
    is removed first, so what is read is the running line's, written as it exits."""
    import signal
    import time

    path = os.path.join(topo.STATE_DIR, f"{st['name']}.delayline0.json")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    for pid in st.get("delay_line_pids") or []:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for _ in range(100):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):  # not written yet, or half written
            time.sleep(0.05)
    raise AssertionError(f"the delay line wrote no counters to {path}")


def test_hundred_microsecond_rtt_is_delivered_or_the_machine_floor_is_named():
    _skip()
    name = _name("b")
    st = net.up(name, 2, rate="1gbit", delay="50us")
    try:
        # up() calibrated: the path's own cost came off the line's delay. At 100 us that cost is most of
        # the RTT: ~40-80 us on a quiet machine, 100-200 us seen under load (steal time on a shared
        # 2-core VM, and each sleeping endpoint's wake-up). Either the calibrated line delivers the ask,
        # or calibration took the line to zero because the path alone already takes the asked RTT (the
        # machine's floor, which status reports as measured). Up to three tries, calibrating again.
        seen = []
        for _ in range(3):
            r = sorted(net.probe(st, 0, 1, rounds=300)["rtt_us"]["median"] for _ in range(3))[1]
            seen.append((st["delay_line_ns"], r))
            if 75 <= r <= 140 or (st["delay_line_ns"] == 0 and r >= 95):
                break
            net.calibrate_delay_lines(st)
        line, r = seen[-1]
        assert 75 <= r <= 140 or (line == 0 and r >= 95), seen
        assert line < 50_000, seen  # corrected for its own cost
    finally:
        net.down(st)
    assert _gone(name) == []


def test_zones_host_delay_and_a_slow_host():
    _skip()
    name = _name("z")
    st = net.up(name, 4, rate="1gbit", delay="200us", zones=2, zone_delay="500us", host_delay=["3=300us"],
                host_rate=["1=300mbit"])
    try:
        want = {(0, 2): 1400, (2, 3): 1000, (0, 3): 2000}  # 2 x (200 [+ 500 across zones] [+ 300 to host 3])
        for (a, b), us in want.items():
            assert net.expected_rtt_ns(st, a, b) == us * 1000
            got = net.probe(st, a, b)["rtt_us"]["median"]
            assert 0.85 * us <= got <= 1.2 * us, (a, b, got)
        slow = net.probe(st, 0, 1, stream=2.0)
        assert 0.8 * 37.5 <= slow["stream_MBps"] <= 1.1 * 37.5, slow  # host 1 at 300 Mbit/s
        fast = net.probe(st, 0, 2, stream=2.0)
        assert fast["stream_MBps"] >= 0.8 * 125, fast
    finally:
        net.down(st)
    assert _gone(name) == []


@pytest.mark.parametrize("kw, what", [
    (dict(delay="100"), "--delay"), (dict(delay="1 hour"), "--delay"), (dict(loss="0.1"), "--loss"),
    (dict(loss="200%"), "--loss"), (dict(host_delay=["7=1ms"]), "--host-delay"), (dict(host_rate=["1=fast"]), "rate"),
    (dict(zones=5), "--zones"), (dict(jitter="-3us"), "--jitter"),
])
def test_bad_network_options_are_refused_naming_them(kw, what):
    _skip()
    name = _name("e")
    with pytest.raises(ValueError, match=what):
        net.up(name, 3, **kw)
    assert _gone(name) == []


def test_cli_up_status_probe_down():
    _skip()
    name = _name("c")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(net.__file__))),
                                                       HERE] + sys.path))
    run = lambda *a: subprocess.run([sys.executable, "-m", "harp_dev.cluster", *a, "--name", name], capture_output=True,
                                    text=True, timeout=240, env=env)
    up = run("up", "--hosts", "2", "--delay", "250us", "--jitter", "20us")
    try:
        assert up.returncode == 0, up.stderr
        status = run("status")
        assert "delay line: one-way 250 us" in status.stdout and "asked 500 us" in status.stdout, status.stdout
        pr = run("probe", "--stream", "0")
        assert pr.returncode == 0, pr.stderr
        assert 400 <= json.loads(pr.stdout)["rtt_us"]["median"] <= 650, pr.stdout
        h = subprocess.run([sys.executable, "-m", "harp_dev.cluster", "up", "--help"], capture_output=True, text=True,
                           env=env).stdout
        assert "harp-delayline" in h
    finally:
        d = run("down")
    assert d.returncode == 0, d.stderr
    assert _gone(name) == []


def test_calibrate_measures_the_rtt_term_between_hosts_and_explain_shows_it(tmp_path):
    """scripts/calibrate.py --cluster: alpha is half the hosts' round trip; the cost model then uses it."""
    _skip()
    name = _name("k")
    st = net.up(name, 2, rate="1gbit", delay="250us")
    import harp
    root = os.path.dirname(HERE)
    # harp from where this test imports it (CI: the installed wheel; the source tree has no build)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(harp.__file__)), HERE]))
    try:
        r = subprocess.run([sys.executable, os.path.join(root, "scripts", "calibrate.py"), "--cluster", name,
                            "--iters", "100"], capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        line = next(l for l in r.stdout.splitlines() if l.startswith("tcp "))
        alpha = float(line.split()[1])
        assert 0.7 * 250e-6 <= alpha <= 1.5 * 250e-6, r.stdout  # asked RTT 500 us; on loopback ~15 us
        assert "# bandwidth-delay product" in r.stdout and "tcp_rmem max" in r.stdout, r.stdout
    finally:
        net.down(st)
    calib = tmp_path / "calib.txt"
    calib.write_text(r.stdout)
    e = subprocess.run([sys.executable, "-m", "harp.tools.config", "--explain", "allreduce", "8", "--ranks", "8",
                        "--transport", "tcp"], capture_output=True, text=True, timeout=120,
                       env=dict(env, HARP_CALIBRATION_FILE=str(calib)))
    assert e.returncode == 0, e.stderr
    assert f"alpha {alpha * 1e6:.3g} us" in e.stdout and "RTT" in e.stdout, e.stdout


def test_calibration_window_report_says_when_a_stream_cannot_cover_the_bdp():
    import importlib.util
    spec = importlib.util.spec_from_file_location("calibrate", os.path.join(os.path.dirname(HERE), "scripts",
                                                                           "calibrate.py"))
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)
    # 1 ms RTT at 1 Gbit/s: BDP 125 KB, well inside Linux's default 6 MiB / 4 MiB
    lines, short = cal.window_report(500e-6, 8e-9, 6 << 20, 4 << 20)
    assert not short and len(lines) == 1 and "bandwidth-delay product 122 KiB" in lines[0], lines
    # 2 ms RTT at 25 Gbit/s: BDP 6.25 MB, more than a 3 MiB window
    lines, short = cal.window_report(1e-3, 1 / 3.125e9, 6 << 20, 4 << 20)
    assert short and "tcp_rmem" in lines[-1] and str(2 * int(2e-3 * 3.125e9)) in lines[-1], lines
    assert cal.window_report(1e-3, 0.0, 6 << 20, 4 << 20) == ([], False)  # no beta measured: nothing to say
