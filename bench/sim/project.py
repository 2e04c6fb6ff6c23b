"""bench/sim/project.py — HARP's allreduce at 64-1024 ranks, simulated.

    python3 bench/sim/project.py --out docs/scale-projection.md

For each VPC platform (VPCS: 25 Gbit/s NICs, 10 Gbit/s per flow, RTT 100 us
and 1 ms, 8 ranks per host), rank count (64, 256, 1024) and size (8 B to
256 MB), harp_sched emits the schedule of every algorithm (flat: ring,
recursive_doubling, halving_doubling, tree; hierarchical: leader; compressed:
the fp16 ring) and replay.py replays it. A schedule of more than --max-msgs
messages is not replayed (the Python replayer does ~10^4 messages a second on
this machine; the ring at 1024 ranks posts 2 x 1023 messages per rank):
its cell says so. The tuner check asks HARP's selector (harp-config
--explain, with a calibration file made from the platform's constants) what
it picks at each size and compares that algorithm's simulated time with the
best simulated one. Writes the markdown, a plot beside it (.png) and the
JSON of every cell (results/sim/projection.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402
import platforms  # noqa: E402
import replay  # noqa: E402
import schedule  # noqa: E402

ROOT = schedule.ROOT
LOCAL = 8
RANKS = (64, 256, 1024)
SIZES = DEFAULT_SIZES = (8, 65536, 1 << 20, 16 << 20, 256 << 20)
ALGOS = ("ring", "recursive_doubling", "halving_doubling", "tree", "leader", "ring_fp16")
FLAT = ("ring", "recursive_doubling", "halving_doubling", "tree")
VPCS = {
    "vpc-25g-rtt100us": dict(link_Bps=25e9 / 8, flow_cap_Bps=10e9 / 8, rtt_s=100e-6),
    "vpc-25g-rtt1ms": dict(link_Bps=25e9 / 8, flow_cap_Bps=10e9 / 8, rtt_s=1e-3),
}


def vpc_spec(name: str, p: int, send_overhead_s: float) -> platforms.Spec:
    return calibrate.ARENA.but(hosts=p // LOCAL, local=LOCAL, shm_Bps=8e9, send_overhead_s=send_overhead_s,
                               **VPCS[name])


def cell(name: str, p: int, algo: str, nbytes: int, o_send: float, max_msgs: int) -> dict:
    comp = "fp16" if algo == "ring_fp16" else None
    s = schedule.emit(None if comp else algo, p, nbytes, p // LOCAL, comp)
    msgs = sum(1 for ops in s.ranks for op in ops if op[0] == "S")
    out = {"platform": name, "p": p, "algo": algo, "bytes": nbytes, "messages": msgs}
    if msgs > max_msgs:
        out["skipped"] = f"{msgs} messages > --max-msgs {max_msgs}"
        return out
    out["us"] = replay.simulate(s, vpc_spec(name, p, o_send)) * 1e6
    return out


def tuner_pick(name: str, p: int, nbytes: int, spec: platforms.Spec, python: str) -> str:
    """HARP's selector's choice for this platform, asked through harp-config --explain."""
    alpha = spec.rtt_s / 2 + spec.send_overhead_s
    beta = 1 / min(spec.link_Bps, spec.flow_cap_Bps or spec.link_Bps)
    gamma = 1 / spec.reduce_Bps
    with tempfile.NamedTemporaryFile("w", suffix=".cal", delete=False) as f:
        f.write("# HARP calibration: bench/sim/project.py, the simulated platform " + name + "\n")
        f.write("# transport  alpha_s  beta_s_per_byte  gamma_s_per_byte\n")
        f.write(f"tcp {alpha:.3e} {beta:.3e} {gamma:.3e}\n")
        f.write(f"shm {spec.shm_lat_s + 1e-6:.3e} {1 / spec.shm_Bps:.3e} {gamma:.3e}\n")
    try:
        env = dict(os.environ, HARP_CALIBRATION_FILE=f.name, PYTHONPATH=str(ROOT / "python"))
        out = subprocess.run([python, "-m", "harp.config", "--explain", "allreduce", str(nbytes), "--ranks", str(p),
                              "--hosts", str(p // LOCAL), "--ppn", str(LOCAL), "--transport", "mixed",
                              "--in-place"], capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.unlink(f.name)
    for line in out.stdout.splitlines():
        if line.startswith("pick: "):
            return line.split()[1]
    raise RuntimeError(f"harp-config --explain gave no pick: {out.stdout[-500:]} {out.stderr[-500:]}")


def fmt_us(c: dict) -> str:
    if "us" not in c:
        return f"n/s ({c['messages'] // 1000}K msgs)"
    us = c["us"]
    return f"{us:.0f} us" if us < 1e4 else f"{us / 1e3:.1f} ms" if us < 1e7 else f"{us / 1e6:.2f} s"


def markdown(cells: list, picks: dict, o_send: float, command: str) -> str:
    out = ["# Scale projection: HARP's allreduce at 64-1024 ranks (SimGrid)", "",
           f"Regenerate: `{command}` (bench/sim/project.py; the arena calibration is bench/RESULTS-scale.md).", "",
           f"Platforms: 8 ranks per host, 25 Gbit/s NICs (split duplex), 10 Gbit/s per flow, shm 8 GB/s per rank, "
           f"reduction 3 GB/s, {o_send * 1e6:g} us CPU per message (fitted on the arena). Times: the slowest rank. "
           "n/s: not simulated (too many messages for the Python replayer).", ""]
    by = {(c["platform"], c["p"], c["algo"], c["bytes"]): c for c in cells}
    for name in VPCS:
        out += [f"## {name}", ""]
        for p in RANKS:
            out += [f"### {p} ranks ({p // LOCAL} hosts x {LOCAL})", "",
                    "| bytes | " + " | ".join(ALGOS) + " | best flat/hier | tuner picks | picked / best |",
                    "|---:|" + "---:|" * len(ALGOS) + "---|---|---:|"]
            for n in SIZES:
                row = [by[(name, p, a, n)] for a in ALGOS]
                sim = {c["algo"]: c["us"] for c in row if "us" in c and c["algo"] != "ring_fp16"}
                best = min(sim, key=sim.get) if sim else "-"
                pick = picks.get((name, p, n), "-")
                ratio = f"{sim[pick] / sim[best]:.3f}" if pick in sim else "not simulated"
                out.append(f"| {n} | " + " | ".join(fmt_us(c) for c in row) + f" | {best} | {pick} | {ratio} |")
            out.append("")
    return "\n".join(out)


def plot(cells: list, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(VPCS), figsize=(12, 4.5), sharey=True)
    for ax, name in zip(axes, VPCS):
        for algo in ALGOS:
            pts = sorted((c["bytes"], c["us"]) for c in cells
                         if c["platform"] == name and c["p"] == 1024 and c["algo"] == algo and "us" in c)
            if pts:
                ax.loglog([x for x, _ in pts], [y / 1e6 for _, y in pts], marker="o", label=algo)
        ax.set_title(f"1024 ranks (128 x 8), {name}")
        ax.set_xlabel("bytes per rank")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("allreduce time (s), simulated")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    global RANKS, SIZES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs/scale-projection.md"))
    ap.add_argument("--json", default=str(ROOT / "results/sim/projection.json"))
    ap.add_argument("--calibration", default=str(ROOT / "results/sim/calibration.json"),
                    help="calibrate.py's JSON: the fitted per-message CPU time")
    ap.add_argument("--max-msgs", type=int, default=150_000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--python", default=sys.executable, help="a Python that imports harp (for the tuner)")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)), help="rank counts (multiples of 8)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes per rank")
    a = ap.parse_args()
    RANKS = tuple(int(x) for x in a.ranks.split(","))
    SIZES = tuple(int(x) for x in a.sizes.split(","))
    if any(p % LOCAL or p < 2 * LOCAL for p in RANKS):
        ap.error(f"--ranks: every count must be a multiple of {LOCAL} with at least 2 hosts")
    o_send = json.loads(Path(a.calibration).read_text())["spec"]["send_overhead_s"]
    jobs = [(name, p, algo, n) for name in VPCS for p in RANKS for n in SIZES for algo in ALGOS]
    with ThreadPoolExecutor(a.jobs) as ex:
        cells = list(ex.map(lambda j: cell(*j, o_send, a.max_msgs), jobs))
    picks = {(name, p, n): tuner_pick(name, p, n, vpc_spec(name, p, o_send), a.python)
             for name in VPCS for p in RANKS for n in SIZES}
    command = "python3 bench/sim/project.py --out " + os.path.relpath(a.out, ROOT)
    if a.ranks != ",".join(map(str, (64, 256, 1024))) or a.sizes != ",".join(map(str, DEFAULT_SIZES)):
        command += f" --ranks {a.ranks} --sizes {a.sizes}"
    if a.max_msgs != 150_000:
        command += f" --max-msgs {a.max_msgs}"
    Path(a.out).write_text(markdown(cells, picks, o_send, command) + "\n")
    plot(cells, Path(a.out).with_suffix(".png"))
    Path(a.json).write_text(json.dumps({"cells": cells, "picks": [
        {"platform": k[0], "p": k[1], "bytes": k[2], "pick": v} for k, v in picks.items()]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
