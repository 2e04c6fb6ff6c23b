"""harp-bench --plot FILE.png: bus bandwidth against message size, one line per library.

matplotlib is imported here, lazily, only when a plot is asked for (it is in
the comparison dependencies, scripts/deps/compare.pip, not the library's).
For each library the in-place time is drawn where it was measured, else the
out-of-place one (the form each peer supports, as in the comparison table).
"""
from __future__ import annotations

from . import sweep


def series(coll, res):
    """[(size, busbw GB/s)] of one library's merged result."""
    n = res["nranks"]
    pts = []
    for r in res["rows"]:
        key = "ip_us" if r.get("ip_us") else "oop_us"
        bw = sweep.busbw(coll, r, n, key)
        if bw:
            pts.append((r["size"], bw))
    return pts


def plot(path, coll, results, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("harp-bench --plot needs matplotlib (bash scripts/install-deps.sh --compare)") from None
    fig, ax = plt.subplots(figsize=(8, 5))
    for lib, res in results.items():
        pts = series(coll, res) if res else []
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lib)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
