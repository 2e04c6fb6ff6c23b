"""What the always-on flight recorder costs: 8-byte allreduce latency with the recorder on and
off, in one run, interleaved (issue 19; goal <= 1%).

Two communicators over the same ranks, made by split() from the world, one with HARP_FR_ENTRIES=2000
(the default: ring, op counters, metrics) and one with HARP_FR_ENTRIES=0 (none of them). Rounds
alternate between them (on, off, off, on, ...) so drifting machine load hits both alike; each round
times `--iters` blocking allreduces of 2 float32 through the Python API. Reported: the median
per-call latency over rounds for each, the ratio on/off, and the spread (min..max of the per-round
ratios of adjacent on/off rounds). A JSON record (bench/vpc/stamp.py) goes to --json.

    PYTHONPATH=python python3 bench/recorder_overhead.py --ranks 2 --transport shm --rounds 40 --iters 2000
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "vpc"))

import numpy as np  # noqa: E402

import harp  # noqa: E402
from harness import run_ranks  # noqa: E402
from stamp import stamp  # noqa: E402


def _rank(rank, size, rounds, iters, swap):
    world = harp.init()
    made = {}
    for name in (("on", "off") if swap else ("off", "on")):  # --swap: the recorder's communicator first
        os.environ["HARP_FR_ENTRIES"] = "2000" if name == "on" else "0"
        made[name] = world.split(0, rank)
    on, off = made["on"], made["off"]
    x = np.ones(2, np.float32)
    for c in (on, off):  # warm up
        for _ in range(iters):
            c.allreduce(x)
    times = {"on": [], "off": []}
    for r in range(rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        for name in order:
            c = on if name == "on" else off
            world.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                c.allreduce(x)
            times[name].append((time.perf_counter() - t) / iters * 1e6)
    recorded = harp.debug.status()["comms"]
    return times, [c["ops"] for c in recorded]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--swap", action="store_true", help="create the recorder's communicator first")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    import harp.debug  # noqa: F401
    load0 = os.getloadavg()
    res = run_ranks(a.ranks, _rank, a.rounds, a.iters, a.swap, env={"HARP_TRANSPORT": a.transport}, timeout=3600)
    times, ops = res[0]
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    ratios = [x / y for x, y in zip(times["on"], times["off"])]
    out = {"stamp": stamp(), "command": " ".join([sys.executable] + sys.argv), "ranks": a.ranks,
           "transport": a.transport, "swap": a.swap, "rounds": a.rounds, "iters": a.iters, "loadavg_before": load0,
           "median_us": {"on": on, "off": off}, "ratio_on_off": on / off,
           "per_round_ratio": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)},
           "rank0_ops_recorded": ops, "rounds_us": times}
    print(f"{a.ranks} ranks, {a.transport}{' (recorder comm made first)' if a.swap else ''}, 8-byte allreduce: recorder on {on:.3f} us, off {off:.3f} us, "
          f"on/off {on / off:.4f} (per-round ratio min {min(ratios):.3f} median {statistics.median(ratios):.4f} "
          f"max {max(ratios):.3f}); load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
