"""bench/sim/project.py's cache bookkeeping, without replays: --restamp-from's check."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench/sim"))
import project  # noqa: E402


def _cells():
    cells = []
    for i, (algo, wall) in enumerate((("ring", 3.0), ("ring", 1.0), ("bruck", 2.0), ("pat", 9.0))):
        cells.append({"platform": "vpc", "coll": "allgather", "p": 64, "algo": algo, "size": 8 << i,
                      "us": 100.0 + i, "wall_s": wall, "sched": f"new{i}", "restamp": True})
    cells.append({"platform": "vpc", "coll": "allgather", "p": 64, "algo": "ring", "size": 1, "us": 5.0,
                  "sched": "same"})  # reused as is: not a candidate
    return cells


def test_restamp_keeps_the_times_when_every_checked_cell_replays_the_same():
    cells, asked = _cells(), []

    def replay_cell(job):
        asked.append(job)
        return next(dict(c) for c in cells if (c["platform"], c["coll"], c["p"], c["algo"], c["size"]) == job)

    project.check_restamps(cells, 3, "abc123", replay_cell)
    # the cheapest of each algorithm first: ring (1 s), bruck, pat; not the 3 s ring
    assert sorted(j[3] for j in asked) == ["bruck", "pat", "ring"]
    assert ("vpc", "allgather", 64, "ring", 16) in asked
    marked = [c for c in cells if "sched" in c and c["sched"].startswith("new")]
    assert all("restamp" not in c and c["restamped_from"] == "abc123" for c in marked)
    assert "restamped_from" not in cells[-1]


def test_restamp_refuses_when_a_checked_cell_moved():
    cells = _cells()

    def replay_cell(job):
        c = next(dict(c) for c in cells if (c["platform"], c["coll"], c["p"], c["algo"], c["size"]) == job)
        if c["algo"] == "bruck":
            c["us"] *= 1.001
        return c

    with pytest.raises(SystemExit, match="1 of 4 checked cells moved"):
        project.check_restamps(cells, 16, "abc123", replay_cell)
    assert all(c.get("restamp") for c in cells[:4])  # nothing restamped
