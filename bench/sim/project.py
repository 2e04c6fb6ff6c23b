"""bench/sim/project.py — HARP's collectives at 64-1024 ranks, simulated, and
what HARP's selector picks there.

    python3 bench/sim/project.py              # docs/scale-projection.{md,png}, results/sim/projection.json

Grid: the two VPC lines (VPCS: 25 Gbit/s NICs, 10 Gbit/s per flow, RTT 100 us
and 1 ms, 8 ranks per host), rank counts RANKS, sizes SIZES (8 B to 256 MB),
every algorithm of ALGOS: allreduce (flat ring, recursive doubling,
halving-doubling, tree; hierarchical leader and rail; the fp16 compressed
ring), allgather, reduce_scatter and alltoall (every registered tcp
algorithm). A size is what a rank holds: allreduce's vector; allgather's
output, reduce_scatter's input and alltoall's send buffer (p blocks, as
nccl-tests count it), so each rank's block is size / p, at least one float32.

Each cell: harp_sched (bench/sim/emit) writes the schedule HARP's own code
issues, harp_replay (bench/sim/replay, SimGrid S4U) replays it on the
platform; the time is the slowest rank's. A schedule of more than --max-msgs
messages is not replayed (its cell says so), nor one whose replay passes
--timeout. The tuner check asks HARP's selector (harp_sched --pick: core/select
linked, the built-in tuning table, a calibration made from the platform's
constants) for each point and compares its pick's simulated time with the best
simulated algorithm's: goal within 5%. Simulated times are cached (--cache) with
the SHA-256 of what each was replayed from (inputs_digest: schedule, platform,
replayer): a later run emits every schedule again and replays only the cells
whose inputs changed (a cost model change moves a hierarchical algorithm's legs,
nothing else), so a selector change is re-checked without replaying the rest.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402
import platforms  # noqa: E402
import replay  # noqa: E402
import schedule  # noqa: E402

ROOT = schedule.ROOT
LOCAL = 8
RANKS = (64, 128, 256, 512, 1024)
SIZES = (8, 4096, 65536, 1 << 20, 16 << 20, 256 << 20)
ALGOS = {
    "allreduce": ("ring", "recursive_doubling", "halving_doubling", "tree", "leader", "rail", "ring_fp16"),
    "allgather": ("ring", "bruck", "recursive_doubling", "direct", "pat", "leader"),
    "reduce_scatter": ("ring", "bruck", "recursive_halving", "pat", "leader"),
    "alltoall": ("pairwise", "bruck"),
}
# Algorithms the tuner may pick; ring_fp16 changes the result (it is the user's choice), so it is
# shown but never "the best".
LOSSY = ("ring_fp16",)
VPCS = {
    "vpc-25g-rtt100us": dict(link_Bps=25e9 / 8, flow_cap_Bps=10e9 / 8, rtt_s=100e-6),
    "vpc-25g-rtt1ms": dict(link_Bps=25e9 / 8, flow_cap_Bps=10e9 / 8, rtt_s=1e-3),
}
GOAL = 1.05
# SimGrid's cross traffic (each flow's acknowledgements as a reverse flow at 5% of its
# bytes) is off: it ties every flow's reverse path into one max-min system and made the
# replay 5 x slower; its effect, measured on the same schedules, is in bench/RESULTS-scale.md.
REPLAY_FLAGS = ("--cfg", "network/crosstraffic:0")


def vpc_spec(name: str, p: int, send_overhead_s: float) -> platforms.Spec:
    return calibrate.ARENA.but(hosts=p // LOCAL, local=LOCAL, shm_Bps=8e9, send_overhead_s=send_overhead_s,
                               burst_B=0.0, burst_Bps=0.0, **VPCS[name])


def block_bytes(coll: str, p: int, size: int) -> int:
    """The tuner's bytes (count x 4) for a rank holding `size` bytes."""
    if coll == "allreduce":
        return size
    return max(4, size // p // 4 * 4)


def calibration_text(name: str, spec: platforms.Spec) -> str:
    """HARP_CALIBRATION_FILE lines for the platform: tcp alpha = RTT/2 + the send overhead, beta =
    1 / the per-flow rate, gamma = 1 / the reduction rate, overhead = the send overhead, link_beta =
    1 / the NIC's rate (a host's flows together); shm: the
    memory link's latency + the send overhead (the replayer charges every message, shm's too, the
    CPU time of posting it), 1 / its rate, the same overhead."""
    alpha = spec.rtt_s / 2 + spec.send_overhead_s
    beta = 1 / min(spec.link_Bps, spec.flow_cap_Bps or spec.link_Bps)
    gamma = 1 / spec.reduce_Bps
    link_beta = 1 / spec.link_Bps
    return (f"# HARP calibration: bench/sim/project.py, the simulated platform {name}\n"
            "# transport  alpha_s  beta_s_per_byte  gamma_s_per_byte  overhead_s  link_beta_s_per_byte\n"
            f"tcp {alpha:.4e} {beta:.4e} {gamma:.4e} {spec.send_overhead_s:.4e} {link_beta:.4e}\n"
            f"shm {spec.shm_lat_s + spec.send_overhead_s:.4e} {1 / spec.shm_Bps:.4e} {gamma:.4e}"
            f" {spec.send_overhead_s:.4e}\n")


def sched_args(coll: str, algo: str, p: int, nbytes: int) -> list:
    hosts = p // LOCAL
    if algo.startswith("ring_"):
        return schedule.emit_args(None, p, nbytes, hosts, algo[5:])
    return schedule.emit_args(algo, p, nbytes, hosts, extra=("--coll", coll))


# Algorithms that post every message at once (p - 1 sends per rank in one burst). SimGrid
# re-solves the sharing of every flow in flight at each start and end, so their replay costs
# messages squared: 65280 messages (256 ranks) take 41 s alone here, 261632 (512) about 16 x
# that. Their own budget, --max-burst-msgs (default: 256 ranks fit, 512 do not); past it
# they are extrapolated (LINEAR).
BURST = ("direct", "pairwise")


def job_of(c: dict) -> tuple:
    """A cell's job, its key in the cache: (platform, coll, p, algo, size)."""
    return c["platform"], c["coll"], c["p"], c["algo"], c["size"]


@functools.cache
def replayer_source() -> bytes:
    """harp_replay.cc, read once per run (inputs_digest hashes it into every cell's digest)."""
    return (ROOT / "bench/sim/replay/harp_replay.cc").read_bytes()


def inputs_digest(path: str, spec: platforms.Spec, source: bytes | None = None) -> str:
    """SHA-256 of what a replay's time follows from: the schedule, the platform, the replayer's
    flags and its source (`source`, default today's: a change to the replayer invalidates every
    cell, unless --restamp-from shows the change kept their times)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(hashlib.file_digest(f, "sha256").digest())
    h.update(f"{replay.spec_arg(spec)} {' '.join(REPLAY_FLAGS)}".encode())
    h.update(replayer_source() if source is None else source)
    return h.hexdigest()


def cell(job: tuple, o_send: float, max_msgs: int, timeout_s: float, cal_files: dict,
         max_burst_msgs: int | None = None, cached: dict | None = None, old_source: bytes | None = None) -> dict:
    """One cell: its schedule emitted, and replayed unless `cached` (the cache's cell) was
    replayed from the same inputs (inputs_digest, "sched"), as it is after a change that
    moved no message of it (a hierarchical algorithm's legs follow the selector's costs).
    A cell over this run's message budget that a run with a larger one replayed is kept as
    cached (marked "unverified": its schedule is not emitted whole, so not checked). With
    `old_source` (--restamp-from), a cached cell whose inputs differ from today's only by the
    replayer's source being that one is returned "restamp": main checks a sample before trusting it."""
    name, coll, p, algo, size = job
    if algo in BURST and max_burst_msgs is not None:
        max_msgs = min(max_msgs, max_burst_msgs)
    nbytes = block_bytes(coll, p, size)
    out = {"platform": name, "coll": coll, "p": p, "algo": algo, "size": size, "bytes": nbytes}
    spec = vpc_spec(name, p, o_send)
    with tempfile.NamedTemporaryFile("w", suffix=".sched", delete=False) as f:
        path = f.name
    try:
        args = sched_args(coll, algo, p, nbytes) + ["--max-msgs", str(max_msgs), "--out", path,
                                                   "--calibration", cal_files[name]]
        e = subprocess.run(args, capture_output=True, text=True, timeout=600)
        if e.returncode == 3:
            if cached and "us" in cached:  # replayed by a run with a larger budget: kept, not checked
                return dict(cached, reused=True, unverified=True)
            out["skipped"] = f"more than {max_msgs} messages"
            return out
        if e.returncode != 0:
            out["skipped"] = "harp_sched: " + e.stderr.strip()[-300:]
            return out
        out["sched"] = inputs_digest(path, spec)
        if cached and cached.get("sched") == out["sched"] and "us" in cached:
            return dict(cached, reused=True)
        if old_source and cached and "us" in cached and cached.get("sched") == inputs_digest(path, spec, old_source):
            return dict(cached, sched=out["sched"], restamp=True)
        t0 = time.monotonic()
        try:
            r = replay.simulate_file(path, spec, timeout_s=timeout_s, extra=REPLAY_FLAGS)
        except TimeoutError:
            out["skipped"] = f"replay over {timeout_s:.0f} s"
            return out
        except RuntimeError as e:  # one cell's failure is recorded (and shown open), not the run's end
            out["skipped"] = "replay failed: " + str(e).strip().splitlines()[-1][-300:]
            return out
        out.update(us=r["sim_seconds"] * 1e6, messages=r["messages"], wall_s=round(time.monotonic() - t0, 2))
        return out
    finally:
        os.unlink(path)


# Algorithms whose message count grows with p per rank (2(p-1) or p-1 steps): at 512-1024
# ranks their schedules pass the message budget. Their time is then extrapolated from the two
# largest rank counts replayed, linearly in p - 1 (each step costs the same at these sizes).
LINEAR = ("ring", "ring_fp16", "direct", "pairwise")


def extrapolate(cells: list) -> list:
    by = {}
    for c in cells:
        if "us" in c:
            by.setdefault((c["platform"], c["coll"], c["algo"], c["size"]), []).append((c["p"], c["us"]))
    out = []
    for c in cells:
        pts = sorted(by.get((c["platform"], c["coll"], c["algo"], c["size"]), []))
        if "us" not in c and c["algo"] in LINEAR and len(pts) >= 2 and pts[-1][0] < c["p"]:
            (p0, t0), (p1, t1) = pts[-2], pts[-1]
            slope = (t1 - t0) / (p1 - p0)
            c = dict(c, us=t1 + slope * (c["p"] - p1), extrapolated=f"from {p0} and {p1} ranks")
        out.append(c)
    return out


def tuner_pick(cal_file: str, coll: str, p: int, nbytes: int) -> dict:
    """HARP's selector (core/select, linked into harp_sched) for this point."""
    args = [str(schedule.ensure_built()), "--pick", "--coll", coll, "--p", str(p), "--hosts", str(p // LOCAL),
            "--bytes", str(nbytes), "--calibration", cal_file]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    head = out[0].split(maxsplit=3)
    cands = {}
    for line in out[1:]:
        f = line.split(maxsplit=3)
        cands[f[1]] = None if len(f) > 3 else float(f[2])  # None: a restriction fails
    return {"pick": head[1], "source": head[2], "reason": head[3] if len(head) > 3 else "", "model_s": cands}


def fmt_us(c: dict | None) -> str:
    if c is None:
        return "-"
    if "us" not in c:
        return "n/s"
    us = c["us"]
    mark = "~" if c.get("extrapolated") else ""
    return mark + (f"{us:.0f} us" if us < 1e4 else f"{us / 1e3:.1f} ms" if us < 1e7 else f"{us / 1e6:.2f} s")


def check(cells: list, picks: dict) -> list:
    """One row per (platform, coll, p, size): best simulated, the pick, pick / best."""
    by = {(c["platform"], c["coll"], c["p"], c["size"], c["algo"]): c for c in cells}
    rows = []
    for (name, coll, p, size), pk in sorted(picks.items()):
        sim = {a: by[(name, coll, p, size, a)]["us"] for a in ALGOS[coll]
               if a not in LOSSY and "us" in by.get((name, coll, p, size, a), {})}
        best = min(sim, key=sim.get) if sim else None
        pick = pk["pick"]
        row = {"platform": name, "coll": coll, "p": p, "size": size, "bytes": block_bytes(coll, p, size),
               "pick": pick, "source": pk["source"], "best": best, "best_us": sim.get(best),
               "pick_us": sim.get(pick), "simulated": sorted(sim), "not_simulated":
               [a for a in ALGOS[coll] if a not in sim and a not in LOSSY]}
        row["ratio"] = sim[pick] / sim[best] if pick in sim and best else None
        row["extrapolated"] = sorted(a for a in (pick, best) if by.get((name, coll, p, size, a), {}).get("extrapolated"))
        # A pick not simulated, or a best that an unsimulated algorithm could beat: open.
        row["open"] = row["ratio"] is None or bool(row["not_simulated"])
        row["ok"] = not row["open"] and row["ratio"] <= GOAL
        rows.append(row)
    return rows


def model_table(cells: list, picks: dict) -> list:
    """Replayed time over the model's prediction (the selector's cost of that algorithm at that
    point), per collective and algorithm: min / median / max over the replayed points."""
    ratios = {}
    for c in cells:
        pk = picks.get((c["platform"], c["coll"], c["p"], c["size"]))
        model = pk["model_s"].get(c["algo"]) if pk else None
        if "us" in c and model and not c.get("extrapolated"):
            ratios.setdefault((c["coll"], c["algo"]), []).append(c["us"] / (model * 1e6))
    out = ["## Replayed / predicted", "",
           "Each replayed cell's time over the selector's own cost of that algorithm there (what the tuner "
           "compares); 1.00: the model is exact. min / median / max over the replayed points.", "",
           "| collective | algorithm | points | min | median | max |", "|---|---|---:|---:|---:|---:|"]
    for (coll, algo), v in sorted(ratios.items(), key=lambda kv: (list(ALGOS).index(kv[0][0]), kv[0][1])):
        v.sort()
        out.append(f"| {coll} | {algo} | {len(v)} | {v[0]:.2f} | {v[len(v) // 2]:.2f} | {v[-1]:.2f} |")
    return out + [""]


def picks_table(extra: dict) -> list:
    """The selector's picks at rank counts without replays: pick and the model's prediction."""
    if not extra:
        return []
    out = ["## What the tuner picks where nothing was replayed", "",
           "HARP's selector at these points (the model's predicted time of its pick, and of the runner-up), "
           "without a simulated time to check it against.", "",
           "| platform | collective | ranks | size | pick (model) | runner-up (model) |", "|---|---|---:|---:|---|---|"]
    for (name, coll, p, n), pk in sorted(extra.items()):
        m = sorted((v, a) for a, v in pk["model_s"].items() if v is not None)
        pick_s = pk["model_s"].get(pk["pick"])
        other = next(((v, a) for v, a in m if a != pk["pick"]), None)
        out.append(f"| {name} | {coll} | {p} | {n} | {pk['pick']} ({pick_s * 1e3:.3g} ms) | " +
                   (f"{other[1]} ({other[0] * 1e3:.3g} ms)" if other else "-") + " |")
    return out + [""]


def markdown(cells: list, rows: list, o_send: float, command: str) -> str:
    by = {(c["platform"], c["coll"], c["p"], c["size"], c["algo"]): c for c in cells}
    ok = sum(r["ok"] for r in rows)
    known = [r for r in rows if not r["open"]]
    out = ["# Scale projection: HARP's collectives at 64-1024 ranks (SimGrid)", "",
           f"Regenerate: `{command}` (bench/sim/project.py; bench/RESULTS-scale.md has the method and the "
           "calibration against the arena).", "",
           f"Platforms: {LOCAL} ranks per host (block placement), 25 Gbit/s NICs (split duplex), 10 Gbit/s per "
           f"flow, RTT 100 us or 1 ms; shm 8 GB/s per rank, reduction 3 GB/s, {o_send * 1e6:g} us CPU per "
           "message (fitted on the arena). Times: the slowest rank, one call. ~: extrapolated (linear in p - 1 from the "
           "two largest rank counts replayed; rings, pairwise and direct, whose messages grow with p). size: the buffer a rank holds "
           "(allreduce: the vector; allgather: its output, reduce_scatter: its input, alltoall: its send "
           "buffer, p blocks of size / p, at least 4 bytes). n/s: not simulated (over the message budget or "
           "the replay timeout). The tuner's pick: HARP's selector (core/select/selectAlgorithm, the built-in "
           "tuning table, the platform's calibration); ratio = its simulated time / the best simulated "
           "(ring_fp16 excluded: it changes the result).", "",
           f"**Tuner within 5% of the best simulated algorithm: {ok} of {len(known)} points where every "
           f"algorithm was simulated** ({len(rows) - len(known)} more open: an algorithm, or the pick, not "
           "simulated).", ""]
    for coll in ALGOS:
        out += [f"## {coll}", ""]
        for name in VPCS:
            out += [f"### {coll}, {name}", "",
                    "| ranks | size | " + " | ".join(ALGOS[coll]) + " | best | tuner picks | ratio |",
                    "|---:|---:|" + "---:|" * len(ALGOS[coll]) + "---|---|---:|"]
            for r in rows:
                if r["coll"] != coll or r["platform"] != name:
                    continue
                cs = [by.get((name, coll, r["p"], r["size"], a)) for a in ALGOS[coll]]
                ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
                mark = " (open)" if r["open"] else "" if r["ok"] else " **x**"
                out.append(f"| {r['p']} | {r['size']} | " + " | ".join(fmt_us(c) for c in cs) +
                           f" | {r['best'] or '-'} | {r['pick']} | {ratio}{mark} |")
            out.append("")
    miss = [json.dumps({k: (round(r[k], 3) if k == "ratio" else r[k]) for k in
                        ("platform", "coll", "p", "size", "pick", "best", "ratio")}) for r in known if not r["ok"]]
    out += ["The check as JSON (every point: results/sim/projection.json):", "", "```json",
            f'{{"goal": {GOAL}, "points_complete": {len(known)}, "within_goal": {ok}, '
            f'"open": {len(rows) - len(known)}, "misses": [' + ("]}" if not miss else ""),
            *([",\n".join(miss), "]}"] if miss else []), "```", ""]
    return "\n".join(out)


def plot(cells: list, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    # The largest rank count whose cells were (nearly) all replayed.
    done = {q: sum("us" in c for c in cells if c["p"] == q) for q in {c["p"] for c in cells}}
    p = max(q for q in done if done[q] >= 0.9 * max(done.values()))
    fig, axes = plt.subplots(len(VPCS), len(ALGOS), figsize=(18, 8), sharex=True)
    for i, name in enumerate(VPCS):
        for j, coll in enumerate(ALGOS):
            ax = axes[i][j]
            for algo in ALGOS[coll]:
                pts = sorted((c["size"], c["us"]) for c in cells if c["platform"] == name and c["coll"] == coll
                             and c["p"] == p and c["algo"] == algo and "us" in c)
                if pts:
                    ax.loglog([x for x, _ in pts], [y / 1e6 for _, y in pts], marker="o", label=algo)
            ax.set_title(f"{coll}, {p} ranks, {name}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            if i == len(VPCS) - 1:
                ax.set_xlabel("size (bytes a rank holds)")
            if j == 0:
                ax.set_ylabel("seconds (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def check_restamps(new: list, k: int, rev: str, replay_cell) -> None:
    """--restamp-from: replay again up to k of the cells marked "restamp" (the cheapest of each
    algorithm in turn); if every one gives its cached time, all of them keep theirs (stamped with
    today's inputs, "restamped_from" rev); else exit, naming the cells that moved."""
    marked = [c for c in new if c.get("restamp")]
    by_algo: dict = {}
    for c in sorted(marked, key=lambda c: c.get("wall_s", 0)):
        by_algo.setdefault((c["coll"], c["algo"]), []).append(c)
    sample = []
    while len(sample) < min(k, len(marked)):
        for group in by_algo.values():
            if group and len(sample) < k:
                sample.append(group.pop(0))
    with ThreadPoolExecutor(2) as ex:
        again = list(ex.map(lambda c: replay_cell(job_of(c)), sample))
    moved = [(c, r) for c, r in zip(sample, again) if "us" not in r or abs(r["us"] - c["us"]) > 1e-6 * c["us"]]
    for c, r in moved:
        print(f"project: {job_of(c)}: cached {c['us']:.3f} us, replayed now "
              f"{r.get('us', r.get('skipped'))}", file=sys.stderr)
    if moved:
        sys.exit(f"project: --restamp-from {rev}: {len(moved)} of {len(sample)} checked cells moved; "
                 "replay without it")
    print(f"project: --restamp-from {rev}: {len(sample)} of {len(marked)} cells replayed again, every time "
          "the same; the rest keep theirs", file=sys.stderr, flush=True)
    for c in marked:
        del c["restamp"]
        c["restamped_from"] = rev


def main() -> None:
    global RANKS, SIZES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs/scale-projection.md"))
    ap.add_argument("--json", default=str(ROOT / "results/sim/projection.json"))
    ap.add_argument("--calibration", default=str(ROOT / "results/sim/calibration.json"),
                    help="calibrate.py's JSON: the fitted per-message CPU time")
    ap.add_argument("--max-msgs", type=int, default=600_000)
    ap.add_argument("--max-burst-msgs", type=int, default=100_000,
                    help="message budget of the burst algorithms (BURST), whose replay costs messages squared")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per replay")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)), help="rank counts (multiples of 8)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes a rank holds")
    ap.add_argument("--colls", default=",".join(ALGOS))
    ap.add_argument("--cache", default=str(ROOT / "results/sim/projection-cells.jsonl"),
                    help="every replayed cell, one JSON line each, appended as it finishes and reused")
    ap.add_argument("--fresh", action="store_true", help="ignore --cache (replay every cell)")
    ap.add_argument("--picks-only", action="store_true", help="replay nothing: tables and the tuner check "
                    "from --cache")
    ap.add_argument("--no-verify", action="store_true", help="reuse cached cells without emitting their "
                    "schedules to check that they are unchanged")
    ap.add_argument("--retry-timeouts", action="store_true", help="replay again the cells whose replay ran "
                    "out of --timeout")
    ap.add_argument("--restamp-from", metavar="REV", help="a replayer change that keeps every time (a new flag, "
                    "a refactor): cells replayed by REV's harp_replay.cc, their schedules unchanged, keep their "
                    "times if a sample of them (--restamp-check) replayed again gives the same times")
    ap.add_argument("--restamp-check", type=int, default=16, help="cells replayed to check --restamp-from "
                    "(the cheapest of each algorithm in turn)")
    a = ap.parse_args()
    RANKS = tuple(int(x) for x in a.ranks.split(","))
    SIZES = tuple(int(x) for x in a.sizes.split(","))
    colls = tuple(a.colls.split(","))
    if any(p % LOCAL or p < 2 * LOCAL for p in RANKS):
        ap.error(f"--ranks: every count must be a multiple of {LOCAL} with at least 2 hosts")
    if any(c not in ALGOS for c in colls):
        ap.error(f"--colls: choose from {','.join(ALGOS)}")
    o_send = json.loads(Path(a.calibration).read_text())["spec"]["send_overhead_s"]
    tmp = tempfile.mkdtemp(prefix="harp-sim-")
    cal_files = {}
    for name in VPCS:
        cal_files[name] = os.path.join(tmp, name + ".cal")
        Path(cal_files[name]).write_text(calibration_text(name, vpc_spec(name, 64, o_send)))
    old = {}
    if not a.fresh and Path(a.cache).exists():
        for line in Path(a.cache).read_text().splitlines():
            c = json.loads(line)
            old[job_of(c)] = c
    jobs = [(name, coll, p, algo, n) for p in RANKS for name in VPCS for coll in colls for n in SIZES
            for algo in ALGOS[coll]]
    def settled(c: dict) -> bool:
        """A cached cell not to emit again: one whose replay ran out of time (unless
        --retry-timeouts), and with --no-verify any with a time or a reason. The rest go to
        cell(), which emits the schedule and replays only if its inputs' hash changed."""
        if not a.retry_timeouts and c.get("skipped", "").startswith("replay over"):
            return True
        return a.no_verify and ("us" in c or "skipped" in c)

    todo = [j for j in jobs if j not in old or not settled(old[j])]
    if a.picks_only:
        todo = []
    print(f"project: {len(jobs)} cells, {len(todo)} to emit, {sum(j not in old for j in todo)} of them not in "
          "the cache", file=sys.stderr, flush=True)

    unverified = []
    old_source = None
    if a.restamp_from:
        old_source = subprocess.run(["git", "show", f"{a.restamp_from}:bench/sim/replay/harp_replay.cc"], cwd=ROOT,
                                    capture_output=True, check=True).stdout

    def run(j):
        c = cell(j, o_send, a.max_msgs, a.timeout, cal_files, a.max_burst_msgs, old.get(j), old_source)
        if c.pop("unverified", False):
            unverified.append(j)
        if c.pop("reused", False) or c.get("restamp"):
            return c
        with open(a.cache, "a") as f:  # one write per line: the two threads' lines do not mix
            f.write(json.dumps(c) + "\n")
        print(f"  {j}: {fmt_us(c)} {c.get('skipped', '')} ({c.get('wall_s', '-')} s)", file=sys.stderr, flush=True)
        return c

    with ThreadPoolExecutor(a.jobs) as ex:
        new = list(ex.map(run, todo))
    if any(c.get("restamp") for c in new):
        check_restamps(new, a.restamp_check, a.restamp_from,
                       lambda j: cell(j, o_send, a.max_msgs, a.timeout, cal_files, a.max_burst_msgs))
    if unverified:
        print(f"project: {len(unverified)} cached cells over this run's message budget kept unchecked (run with "
              f"the budget that replayed them to check them): {', '.join(map(str, sorted(unverified)[:6]))}"
              f"{', ...' if len(unverified) > 6 else ''}", file=sys.stderr, flush=True)
    merged = {**old, **{job_of(c): c for c in new}}
    cells = list(merged.values())  # the cache's cells of other ranks and sizes too
    if new:  # the cache compacted: one line per cell, the latest
        tmp_cache = a.cache + ".tmp"
        Path(tmp_cache).write_text("".join(json.dumps(c) + "\n" for c in cells))
        os.replace(tmp_cache, a.cache)
    cells = extrapolate(cells)
    grid = sorted({(c["platform"], c["coll"], c["p"], c["size"]) for c in cells})
    picks = {(name, coll, p, n): tuner_pick(cal_files[name], coll, p, block_bytes(coll, p, n))
             for name, coll, p, n in grid}
    rows = check(cells, picks)
    command = "python3 bench/sim/project.py"
    if a.out != str(ROOT / "docs/scale-projection.md"):
        command += " --out " + os.path.relpath(a.out, ROOT)
    for flag, val, default in (("--ranks", a.ranks, ",".join(map(str, (64, 128, 256, 512, 1024)))),
                               ("--sizes", a.sizes, ",".join(map(str, (8, 4096, 65536, 1 << 20, 16 << 20,
                                                                          256 << 20)))),
                               ("--colls", a.colls, ",".join(ALGOS)), ("--max-msgs", str(a.max_msgs), "600000"),
                               ("--max-burst-msgs", str(a.max_burst_msgs), "100000"),
                               ("--timeout", f"{a.timeout:g}", "900")):
        if val != default:
            command += f" {flag} {val}"
    extra = {(name, coll, p, n): tuner_pick(cal_files[name], coll, p, block_bytes(coll, p, n))
             for name in VPCS for coll in colls for p in (64, 128, 256, 512, 1024) for n in SIZES
             if (name, coll, p, n) not in picks}
    Path(a.out).write_text(markdown(cells, rows, o_send, command) + "\n" + "\n".join(model_table(cells, picks)) +
                           "\n" + "\n".join(picks_table(extra)) + "\n")
    plot(cells, Path(a.out).with_suffix(".png"))
    Path(a.json).write_text(json.dumps({"command": command, "send_overhead_s": o_send, "cells": cells,
                                        "check": rows, "picks_not_replayed": [
                                            {"platform": k[0], "coll": k[1], "p": k[2], "size": k[3], **v}
                                            for k, v in sorted(extra.items())]}, indent=1) + "\n")
    done = [r for r in rows if not r["open"]]
    print(f"project: tuner within 5% at {sum(r['ok'] for r in done)} of {len(done)} complete points "
          f"({len(rows) - len(done)} open)", file=sys.stderr)


if __name__ == "__main__":
    main()
