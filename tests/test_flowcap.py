"""The arena's per-TCP-flow cap (harp-cluster up --flow-cap): one flow
gets at most the cap, several flows of one host pair add up (the cap is per
flow, not per host pair), and `harp-cluster throttle` caps one chosen flow.

A small arena (2 hosts, 200 Mbit/s links, 50 Mbit/s per flow) and python
sockets (tests/flowrate.py). The assertions bound rates from above (a capped
flow never beats its cap by more than the shaper's burst allows) or ask only
for a sum well above one cap, so a slow, loaded machine cannot fail them.
"""
import json
import subprocess
import sys
import os

import pytest

from harp_dev.cluster import net, topology as topo
from test_cluster import _leftovers, _name, _skip_reason

HERE = os.path.dirname(os.path.abspath(__file__))
CAP = 50e6


def _flows(st, n, seconds=2.0, sport=0, port=5001):
    a, b = topo.host_ns(st["name"], 0), topo.host_ns(st["name"], 1)
    srv = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, os.path.join(HERE, "flowrate.py"), "serve",
                            str(port), str(n)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().startswith("READY")
        subprocess.run(["ip", "netns", "exec", a, sys.executable, os.path.join(HERE, "flowrate.py"), "send",
                        topo.address(st["slot"], 1), str(port), str(n), str(seconds), str(sport)],
                       timeout=120, check=True)
        out = json.loads(srv.stdout.readline())
        srv.wait(60)
    finally:
        if srv.poll() is None:
            srv.kill()
    return out["rate_bps"]


def test_one_flow_capped_several_add_up_one_throttled():
    why = _skip_reason()
    if why:
        pytest.skip(why)
    name = _name("fc")
    st = net.up(name, 2, rate="200mbit", flow_cap="50mbit")
    try:
        classes = subprocess.run(["tc", "-n", topo.host_ns(name, 0), "class", "show", "dev", "eth0"],
                                 capture_output=True, text=True).stdout
        assert classes.count("ceil 50Mbit") == net.FLOW_BUCKETS, classes
        one = _flows(st, 1)
        assert 0 < one[0] <= 1.2 * CAP, one
        four = _flows(st, 4, sport=41000)  # consecutive source ports: four different classes
        assert max(four) <= 1.2 * CAP, four
        assert sum(four) >= 2.0 * CAP, four  # more than one cap: per flow, not per host pair
        net.throttle_flow(st, 0, 42001, 5002, "10mbit")
        three = _flows(st, 3, sport=42000, port=5002)
        assert three[1] <= 1.2 * 10e6, three  # the throttled flow
        assert max(three[0], three[2]) > 1.5 * 10e6, three  # the others are not
        assert max(three[0], three[2]) <= 1.2 * CAP, three  # ... and keep their own cap
        net.throttle_flow(st, 0, 43001, 5003, "10mbit")  # moving the throttle leaves the caps too
        one = _flows(st, 1, sport=44000, port=5003)
        assert 1.5 * 10e6 < one[0] <= 1.2 * CAP, one
    finally:
        problems = net.down(st)
    assert problems == []
    assert _leftovers(name, 2) == []
