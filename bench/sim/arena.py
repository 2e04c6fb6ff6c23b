"""bench/sim/arena.py — the measured arena points the simulator is calibrated
against: HARP's allreduce on the emulated hosts of harp-cluster (one rank per
host, 1 Gbit/s veths through one switch), read from the benchmark JSON files.

    points()  ->  [Point(file, hosts, rtt_us, algo, nbytes, us), ...]

Sources (each the median over its repetitions of the slowest rank's time), in results/arena/:
  tuner-rtt-quiet.json               4 hosts, RTT 0 and 1 ms, forced ring/rd/hd, a quiet machine,
        2 repetitions x in place and out of place (87cdaff's tree; stop 44)
  tuner-tree-6hosts-rtt1ms.json      6 hosts, RTT 1 ms, forced ring/rd/hd (its tree is the tree
        before the depth-staggered steps, not today's code: left out)
  tuner-tree2-6hosts-rtt1ms.json     6 hosts, RTT 1 ms, today's tree
  allreduce-4-8hosts-quiet-4c2902b.json  4 and 8 hosts, RTT 0, HARP's own choice (auto), which
        the tuning table then made rd < 16K, hd 16K-2M, ring >= 2M
and results/sim/arena-*.json: tuner_bench.py runs made for the calibration (2 and 8 hosts, a quiet
machine, 2026-12-06; 6 hosts at RTT 1 ms again, quiet, 2026-12-06 17:11, which supersedes the two
6-host files above; 4 hosts at RTT 0 again, quiet, 2026-12-06 20:53, with the tree, which supersedes
tuner-rtt-quiet.json's RTT 0 points. Up to 4 KB its recursive doubling and halving-doubling ran
1.3-2.0 x faster than that file's and its ring 0.7-0.9 x as fast: 4 ranks on 2 cores at RTT 0 do
not repeat within 15%. At 256 KB halving-doubling took 3.19 ms against 5.18, the ring 3.87 against
3.25). A point measured twice counts once: the later run's.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORCED = ("ring", "recursive_doubling", "halving_doubling", "tree")


@dataclass(frozen=True)
class Point:
    file: str
    hosts: int
    rtt_us: float      # added round trip (0 or the netem delay x 2)
    algo: str
    nbytes: int
    us: float
    iters: int = 1     # the benchmark's timed calls of this size, back to back
    warmup: int = 0    # and its untimed calls before them (the replay runs both: calibrate.py)


def auto_algo(nbytes: int) -> str:
    """The tuning table's flat choice on the arena at RTT <= 100 us (core/select/tuning.tsv)."""
    return "recursive_doubling" if nbytes < 16384 else "halving_doubling" if nbytes < 2 << 20 else "ring"


def _median(runs: list, size: str) -> float:
    """Median over the repetitions' figures (tuner_bench.py since 87cdaff keeps each repetition's
    timed loops, in place and out of place, as a list)."""
    vals = []
    for r in runs:
        if size in r:
            vals += r[size] if isinstance(r[size], list) else [r[size]]
    return statistics.median(vals)


def _loop(sweeps: list, nbytes: int) -> tuple:
    """(iterations, warm-up) of the sweep that measured `nbytes`: tuner_bench.py's SWEEPS,
    (min, max, factor, iterations, warm-up), recorded in each file."""
    for lo, hi, _, iters, warmup in sweeps:
        if lo <= nbytes <= hi:
            return iters, warmup
    raise ValueError(f"arena: no sweep of {sweeps} measured {nbytes} bytes")


def _tuner(path: Path, algos: tuple = FORCED) -> list:
    d = json.loads(path.read_text())
    out = []
    for delay, v in d["by_delay"].items():
        hosts = v["cluster"]["hosts"]
        rtt = 2 * v["cluster"]["delay_ns"] / 1000
        for algo in algos:
            runs = v["runs"].get(algo)
            if not runs:
                continue
            for size in runs[0]:
                out.append(Point(path.name, hosts, rtt, algo, int(size), _median(runs, size),
                                 *_loop(d["sweeps"], int(size))))
    return out


def _quiet(path: Path) -> list:
    d = json.loads(path.read_text())
    out = []
    for hosts, v in d["by_hosts"].items():
        for size, s in v["summary"]["harp"].items():
            # arena_bench.py's sweeps at its defaults (the file's command sets neither):
            # 8 B x 200 after 20, 1-64 MB x 5 after 2
            loop = (200, 20) if int(size) < (1 << 20) else (5, 2)
            out.append(Point(path.name, int(hosts), 0.0, auto_algo(int(size)), int(size), s["us_median"], *loop))
    return out


def _stamp(path: Path) -> str:
    d = json.loads(path.read_text())
    return (d.get("stamp_before") or {}).get("time", "")


def points() -> list:
    """Every source's points; where two measured the same point (hosts, RTT, algorithm, size),
    the later run's (a rerun supersedes: the sources are read oldest first)."""
    res = ROOT / "results/arena"
    pts = _tuner(res / "tuner-tree-6hosts-rtt1ms.json", FORCED[:3])
    pts += _tuner(res / "tuner-tree2-6hosts-rtt1ms.json", ("tree",))
    pts += _quiet(res / "allreduce-4-8hosts-quiet-4c2902b.json")
    pts += _tuner(res / "tuner-rtt-quiet.json")
    for f in sorted((ROOT / "results/sim").glob("arena-*.json"), key=_stamp):
        pts += _tuner(f)
    latest = {(p.hosts, p.rtt_us, p.algo, p.nbytes): p for p in pts}
    return [p for p in latest.values() if p.rtt_us in (0.0, 1000.0)]
