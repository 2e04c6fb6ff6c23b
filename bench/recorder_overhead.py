"""What the always-on flight recorder costs: 8-byte allreduce latency with the recorder on and
off, in one run, interleaved (goal <= 1%).

--mode toggle (default): one communicator; the recorder is paused and resumed between rounds
(_harp.obs_pause, core/observe/recorder.h Recorder::setPaused), so "on" and "off" run the same
connections, buffers and algorithm and differ only by the recording hook in
Communicator::runStages (core/engine/pipeline.cc). --mode split: two communicators split from the world, one made with
HARP_FR_ENTRIES=2000 (the default) and one with 0 (what a user turning the recorder off gets; it
also measures whatever differs between two communicators, e.g. where their buffers landed).

Rounds of `--iters` blocking allreduces of 2 float32 (through the Python API) alternate on, off,
off, on, ... and are short (20 calls, ~0.1-0.5 ms), so the machine's noise (preemption, other
jobs) hits both alike. Reported: the median per-call latency over the rounds of each, their ratio
on/off, the ratio of the means, and the spread: the on/off ratio of medians in each of 10
consecutive blocks of rounds (min, quartiles, max). In toggle mode the bench checks that exactly
the "on" calls were recorded. A JSON record (bench/vpc/stamp.py) goes to --json. The C++-only
path (no Python) is measured by bench/recorder_cost.cc.

    PYTHONPATH=python python3 bench/recorder_overhead.py --ranks 2 --transport shm --rounds 5000 --iters 20
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
from harp import _harp  # noqa: E402
from harness import run_ranks  # noqa: E402
from stamp import stamp  # noqa: E402


def _comms(world, rank, mode, swap):
    """{"on": (comm, pause), "off": (comm, pause)}: pause(True/False) before each round."""
    if mode == "toggle":
        return {"on": (world, lambda: _harp.obs_pause(world._c, False)),
                "off": (world, lambda: _harp.obs_pause(world._c, True))}
    made = {}
    for name in (("on", "off") if swap else ("off", "on")):  # --swap: the recorder's communicator first
        os.environ["HARP_FR_ENTRIES"] = "2000" if name == "on" else "0"
        made[name] = (world.split(0, rank), lambda: None)
    return made


def _rank(rank, size, mode, rounds, iters, swap):
    world = harp.init()
    comms = _comms(world, rank, mode, swap)
    x, y = np.ones(2, np.float32), np.zeros(2, np.float32)
    for name in ("on", "off"):  # warm up
        c, arm = comms[name]
        arm()
        for _ in range(200):
            c.allreduce(x, y)
    world.barrier()
    times = {"on": [], "off": []}
    clock = time.perf_counter
    for r in range(2 * rounds):  # both ranks switch at the same call: the allreduces keep them in step
        name = "on" if r % 4 in (0, 3) else "off"
        c, arm = comms[name]
        arm()
        t = clock()
        for _ in range(iters):
            c.allreduce(x, y)
        times[name].append((clock() - t) / iters * 1e6)
    comms["on"][1]()
    if not np.array_equal(y, np.full(2, size, np.float32)):
        raise AssertionError(f"wrong allreduce result {y}")
    return times, [c["ops"] for c in harp.debug.status()["comms"]]


def _blocks(on, off, k=10):
    """Ratio of the medians (on/off) in each of k consecutive blocks of rounds."""
    n = min(len(on), len(off)) // k
    return [statistics.median(on[i * n:(i + 1) * n]) / statistics.median(off[i * n:(i + 1) * n]) for i in range(k)]


def _quartiles(v):
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return {"min": min(v), "q25": q[0], "median": q[1], "q75": q[2], "max": max(v)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--mode", choices=["toggle", "split"], default="toggle")
    ap.add_argument("--rounds", type=int, default=5000, help="rounds of each (on and off)")
    ap.add_argument("--iters", type=int, default=20, help="calls per round")
    ap.add_argument("--swap", action="store_true", help="--mode split: create the recorder's communicator first")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    import harp.debug  # noqa: F401
    load0 = os.getloadavg()
    res = run_ranks(a.ranks, _rank, a.mode, a.rounds, a.iters, a.swap, env={"HARP_TRANSPORT": a.transport},
                    timeout=3600)
    times, ops = res[0]
    if a.mode == "toggle":  # the switch works: exactly the "on" rounds' calls (and the warm-up) were recorded
        want = 200 + a.rounds * a.iters
        if ops != [want]:
            print(f"WARNING: rank 0 recorded {ops} operations, expected [{want}]")
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    mean_ratio = statistics.fmean(times["on"]) / statistics.fmean(times["off"])
    spread = _quartiles(_blocks(times["on"], times["off"]))
    out = {"stamp": stamp(), "command": " ".join([sys.executable] + sys.argv), "ranks": a.ranks,
           "transport": a.transport, "mode": a.mode, "swap": a.swap, "rounds": a.rounds, "iters": a.iters,
           "loadavg_before": load0, "loadavg_after": os.getloadavg(), "median_us": {"on": on, "off": off},
           "ratio_on_off": on / off, "ratio_of_means": mean_ratio, "block_ratio": spread, "rank0_ops_recorded": ops,
           "rounds_us": {k: [round(x, 3) for x in v] for k, v in times.items()}}
    print(f"{a.ranks} ranks, {a.transport}, --mode {a.mode}{' --swap' if a.swap else ''}, 8-byte allreduce: "
          f"recorder on {on:.3f} us, off {off:.3f} us (medians of {a.rounds} rounds of {a.iters} calls each), "
          f"on/off {on / off:.4f}, of means {mean_ratio:.4f}; 10 blocks' on/off min {spread['min']:.4f} q25 "
          f"{spread['q25']:.4f} median {spread['median']:.4f} q75 {spread['q75']:.4f} max {spread['max']:.4f}; "
          f"load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
