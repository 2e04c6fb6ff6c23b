"""DDP training over gloo and HARP at 1, 2, 4 arena hosts: samples/s and scaling efficiency;
and the same script under each launcher (loss must match the gloo run's).

    python3 bench/vpc/train_bench.py --hosts 1,2,4 --repeat 2 --out results/arena/ddp.json
    python3 bench/vpc/train_bench.py --launchers-only --hosts 3 --out results/arena/ddp-launchers.json

Runs bench/vpc/ddp_train.py (one rank per host, OMP_NUM_THREADS=1) on arena
cluster --name (brought up with max(--hosts) hosts if not up). Efficiency at
H hosts = samples/s(H) / (H x samples/s(1)) with the same backend, medians
over repetitions. Writes one JSON with a provenance stamp.

Hierarchy study: DDP at 4 hosts x 2 ranks, gloo vs HARP flat vs HARP automatic vs rail:
    python3 bench/vpc/train_bench.py --hier --hosts 4 --ppn 2 --repeat 3 --out .../ddp-hier-4x2.json

Bucket-size and compression studies (defaults unchanged without these options):
    python3 bench/vpc/train_bench.py --hosts 4 --bucket-caps 1,25 --repeat 3 --out .../ddp-buckets.json
        DDP on HARP with each bucket_cap_mb (interleaved per repetition): samples/s and the
        ratio of each cap's median to the last cap's (target: 1 MB within 10% of 25 MB).
    python3 bench/vpc/train_bench.py --hosts 4 --rate 100mbit --compress 'topk:0.01!' --seeds 0,1,2 \
        --width 1024 --steps 20 --out .../ddp-topk.json
        per seed: dense HARP, HARP with the comm hook (ddp_train.py --compress) and gloo, same
        steps and data: final loss relative to dense HARP's (target within 1%) and wall time
        ratios (target >= 3x faster than dense HARP and than gloo).

Communication efficiency at round-trip time (the issue's DDP goal: step time within 1.1 x the
step time of the same ranks with communication skipped):
    python3 bench/vpc/train_bench.py --name eff --hosts 4 --delay 250us --efficiency gloo,harp,harp-fp16,harp-topk \
        --repeat 2 --out results/arena/ddp-efficiency-rtt05.json
        per repetition: the no_sync run (ddp_train.py --no-sync, HARP) then each variant (gloo; HARP dense;
        HARP with the fp16 wire hook; HARP top-k 1% with error feedback); step time / no_sync step time
        and the final loss against dense HARP's.

FSDP2 at round-trip time (sharded training: an allgather per layer forward and backward, a
reduce-scatter per layer backward):
    python3 bench/vpc/train_bench.py --name fsdp --hosts 4 --delay 250us --fsdp --width 1024 --steps 50 \
        --repeat 2 --out results/arena/fsdp-rtt05.json
        per repetition gloo then HARP, ddp_train.py --fsdp, same seed and data: step time side by side
        and the largest |loss gloo - loss HARP| over the steps (goal: within 1e-5 after the last).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.abspath(os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)
from harp_dev.cluster import net, topology as topo  # noqa: E402
from stamp import stamp  # noqa: E402


def train(name, hosts, backend, launcher, steps, warmup, timeout=900, extra=(), ppn=1, env_extra=None):
    env = dict(os.environ, PYTHONPATH=PYDIR, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0", **(env_extra or {}))
    cmd = [sys.executable, "-m", "harp_dev.cluster", "run", "--name", name, "--hosts", str(hosts), "--ppn", str(ppn),
           "--launcher", launcher,
           "--timeout", str(timeout), "--", sys.executable, os.path.join(HERE, "ddp_train.py"), "--backend", backend,
           "--steps", str(steps), "--warmup", str(warmup), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
    # Ray forwards worker output with a "(RayTrainWorker pid=..)" prefix
    lines = [l[l.index("TRAIN {"):] for l in r.stdout.splitlines() if "TRAIN {" in l]
    if r.returncode or not lines:
        raise RuntimeError(f"{backend}/{launcher} on {hosts} hosts failed ({r.returncode}): {r.stderr[-2000:]}")
    rec = json.loads(lines[-1][6:])
    rec["launcher"] = launcher
    rec["ppn"], rec["env"] = ppn, dict(env_extra or {})
    print(f"# {hosts}x{ppn} {backend:>4} via {launcher:<8} {' '.join(extra)} {' '.join(f'{k}={v}' for k, v in (env_extra or {}).items())}: "
          f"{rec['samples_per_s']:7.2f} samples/s, "
          f"{rec['seconds']:.2f} s, loss {rec['final_loss']:.6f}", flush=True)
    return rec


def _spread(recs):
    """samples/s of a list of train() records: median, min and max."""
    sps = [r["samples_per_s"] for r in recs]
    return {"samples_per_s_median": statistics.median(sps), "min": min(sps), "max": max(sps)}


def scaling(a, name, hosts_list):
    runs = {b: {h: [] for h in hosts_list} for b in ("gloo", "harp")}
    for rep in range(a.repeat):
        for h in hosts_list:
            for b in ("gloo", "harp"):
                runs[b][h].append(train(name, h, b, "harp", a.steps, a.warmup))
    summary = {}
    for b, by_h in runs.items():
        base = _spread(by_h[hosts_list[0]])["samples_per_s_median"]
        summary[b] = {}
        for h, recs in by_h.items():
            sp = _spread(recs)
            summary[b][h] = {**sp, "efficiency_vs_1_host": sp["samples_per_s_median"] / (h * base)
                             if hosts_list[0] == 1 else None}
    print("## DDP MLP 25.2 M params, batch 16/rank: samples/s (median, min..max) and scaling efficiency")
    for b, rows in summary.items():
        for h, s in rows.items():
            eff = f"{s['efficiency_vs_1_host']:.3f}" if s["efficiency_vs_1_host"] is not None else ""
            print(f"{b:>5} {h} hosts {s['samples_per_s_median']:8.2f} ({s['min']:.2f}..{s['max']:.2f}) eff {eff}")
    return {"runs": runs, "summary": summary}


# Hierarchy study: DDP at H hosts x L ranks, gloo against HARP flat (the selector may not
# pick a hierarchical algorithm: HARP_HIER=0), HARP's automatic choice, and rail forced.
HIER_VARIANTS = {"gloo": ("gloo", {}), "harp-flat": ("harp", {"HARP_HIER": "0"}), "harp-auto": ("harp", {}),
                 "harp-rail": ("harp", {"HARP_ALGO": "allreduce:rail"})}


def hier_study(a, name, hosts):
    """samples/s per variant at hosts x a.ppn, interleaved per repetition."""
    variants = a.variants.split(",")
    runs = {v: [] for v in variants}
    for _ in range(a.repeat):
        for v in variants:
            backend, env = HIER_VARIANTS[v]
            runs[v].append(train(name, hosts, backend, "harp", a.steps, a.warmup, ppn=a.ppn, env_extra=env,
                                 extra=_common(a)))
    summary = {}
    flat = _spread(runs["harp-flat"])["samples_per_s_median"] if "harp-flat" in runs else None
    for v, rs in runs.items():
        sp = _spread(rs)
        summary[v] = {**sp, "x_harp_flat": sp["samples_per_s_median"] / flat if flat else None,
                      "final_loss": [r["final_loss"] for r in rs]}
    print(f"## DDP at {hosts} hosts x {a.ppn} ranks: samples/s median (min..max), x HARP flat")
    for v, s_ in summary.items():
        x = f"{s_['x_harp_flat']:.3f}" if s_["x_harp_flat"] else ""
        print(f"{v:>10} {s_['samples_per_s_median']:8.2f} ({s_['min']:.2f}..{s_['max']:.2f}) {x}")
    return {"runs": runs, "summary": summary}


def launchers(a, name, hosts):
    recs = [train(name, hosts, "gloo", "harp", a.steps, a.warmup)]
    for launcher in a.launchers.split(","):
        recs.append(train(name, hosts, "harp", launcher, a.steps, a.warmup))
    ref = recs[0]["final_loss"]
    for r in recs:
        r["loss_rel_diff_vs_gloo"] = abs(r["final_loss"] - ref) / abs(ref)
    return recs


def _common(a):
    return (["--width", str(a.width)] if a.width else []) + (["--batch", str(a.batch)] if a.batch else [])


def bucket_caps(a, name, hosts):
    """Bucket-size study: DDP on HARP with each --bucket-caps value, interleaved per repetition."""
    caps = [float(c) for c in a.bucket_caps.split(",")]
    runs = {c: [] for c in caps}
    for _ in range(a.repeat):
        for c in caps:
            runs[c].append(train(name, hosts, "harp", "harp", a.steps, a.warmup,
                                 extra=["--bucket-cap-mb", str(c)] + _common(a)))
    summary = {c: _spread(runs[c]) for c in caps}
    last = summary[caps[-1]]["samples_per_s_median"]
    for s_ in summary.values():
        s_["ratio_to_last_cap"] = s_["samples_per_s_median"] / last
    print("## DDP on HARP by bucket_cap_mb: samples/s median (min..max), ratio to the last cap")
    for c, s in summary.items():
        print(f"{c:>6} MB {s['samples_per_s_median']:8.2f} ({s['min']:.2f}..{s['max']:.2f}) {s['ratio_to_last_cap']:.3f}")
    return {"runs": {str(c): r for c, r in runs.items()}, "summary": {str(c): s for c, s in summary.items()}}


def compress_study(a, name, hosts):
    """Compression study: per seed, dense HARP, HARP with the --compress comm hook, and gloo."""
    out = {}
    for seed in [int(x) for x in a.seeds.split(",")]:
        base = ["--seed", str(seed)] + _common(a)
        dense = train(name, hosts, "harp", "harp", a.steps, a.warmup, extra=base)
        comp = train(name, hosts, "harp", "harp", a.steps, a.warmup, extra=base + ["--compress", a.compress])
        gloo = train(name, hosts, "gloo", "harp", a.steps, a.warmup, extra=base)
        out[seed] = {"dense": dense, "compressed": comp, "gloo": gloo,
                     "loss_rel_diff_vs_dense": abs(comp["final_loss"] - dense["final_loss"]) / abs(dense["final_loss"]),
                     "speedup_vs_dense": dense["seconds"] / comp["seconds"],
                     "speedup_vs_gloo": gloo["seconds"] / comp["seconds"]}
    print(f"## {a.compress} comm hook vs dense HARP and gloo, {hosts} hosts, {a.steps} steps")
    for seed, r in out.items():
        print(f"seed {seed}: loss dense {r['dense']['final_loss']:.6f} compressed {r['compressed']['final_loss']:.6f} "
              f"gloo {r['gloo']['final_loss']:.6f} (rel diff {r['loss_rel_diff_vs_dense']:.4f}); "
              f"{r['speedup_vs_dense']:.2f}x dense HARP, {r['speedup_vs_gloo']:.2f}x gloo")
    return {str(k): v for k, v in out.items()}


EFF_VARIANTS = {"gloo": ("gloo", []), "harp": ("harp", []), "harp-fp16": ("harp", ["--compress", "fp16"]),
                "harp-topk": ("harp", ["--compress", "topk:0.01"])}


def fsdp_study(a, name, hosts):
    """FSDP2 (ddp_train.py --fsdp) over gloo and HARP, interleaved per repetition, same seed and data:
    step time side by side, and the loss curves compared step by step (the goal: within 1e-5 after
    the last step)."""
    runs = {"gloo": [], "harp": []}
    for _ in range(a.repeat):
        for b in runs:
            runs[b].append(train(name, hosts, b, "harp", a.steps, a.warmup, extra=_common(a) + ["--fsdp"]))
    out = {b: {"seconds": [r["seconds"] for r in rs], "step_ms_median": 1e3 * statistics.median(r["seconds"] for r in rs)
               / a.steps, "final_loss": [r["final_loss"] for r in rs]} for b, rs in runs.items()}
    diffs = [max(abs(x - y) for x, y in zip(g["losses"], h["losses"])) for g, h in zip(runs["gloo"], runs["harp"])]
    final = [abs(g["final_loss"] - h["final_loss"]) for g, h in zip(runs["gloo"], runs["harp"])]
    out.update(max_step_loss_diff=diffs, final_loss_diff=final,
               harp_over_gloo=out["harp"]["step_ms_median"] / out["gloo"]["step_ms_median"])
    print(f"## FSDP2, {hosts} hosts, {a.steps} steps (+{a.warmup} warm-up): step ms gloo "
          f"{out['gloo']['step_ms_median']:.1f}, harp {out['harp']['step_ms_median']:.1f} "
          f"(harp/gloo {out['harp_over_gloo']:.3f}); |loss gloo - harp| after the last step {final}, "
          f"largest over all steps {diffs}", flush=True)
    return {"runs": runs, "summary": out}


def efficiency_study(a, name, hosts):
    """Communication efficiency: each variant's step time against the same ranks with every step in
    DDP's no_sync() (no communication), interleaved per repetition; and each compressed variant's
    final loss against dense HARP's (same seed and data)."""
    variants = a.efficiency.split(",")
    for v in variants:
        if v not in EFF_VARIANTS:
            raise SystemExit(f"train_bench --efficiency: unknown variant {v!r} (known: {', '.join(EFF_VARIANTS)})")
    runs = {v: [] for v in variants + ["no_sync"]}
    for _ in range(a.repeat):
        runs["no_sync"].append(train(name, hosts, "harp", "harp", a.steps, a.warmup, extra=_common(a) + ["--no-sync"]))
        for v in variants:
            backend, extra = EFF_VARIANTS[v]
            runs[v].append(train(name, hosts, backend, "harp", a.steps, a.warmup, extra=_common(a) + extra))
    med = {v: statistics.median(r["seconds"] for r in rs) for v, rs in runs.items()}
    dense = statistics.median(r["final_loss"] for r in runs["harp"]) if "harp" in runs else None
    summary = {}
    for v in variants:
        loss = statistics.median(r["final_loss"] for r in runs[v])
        summary[v] = {"seconds_median": med[v], "seconds": [r["seconds"] for r in runs[v]],
                      "step_ms": 1e3 * med[v] / a.steps, "efficiency": med["no_sync"] / med[v],
                      "step_over_no_sync": med[v] / med["no_sync"], "final_loss": loss,
                      "loss_rel_diff_vs_dense_harp": abs(loss - dense) / abs(dense) if dense else None}
    summary["no_sync"] = {"seconds_median": med["no_sync"], "seconds": [r["seconds"] for r in runs["no_sync"]],
                          "step_ms": 1e3 * med["no_sync"] / a.steps}
    print(f"## DDP communication efficiency, {hosts} hosts, {a.steps} steps: step time / no_sync step time "
          f"(goal <= 1.1), loss vs dense HARP (goal within 1%)")
    print(f"{'no_sync':>10} step {summary['no_sync']['step_ms']:8.1f} ms")
    for v in variants:
        s_ = summary[v]
        rel = f"{s_['loss_rel_diff_vs_dense_harp']:.4f}" if s_["loss_rel_diff_vs_dense_harp"] is not None else ""
        print(f"{v:>10} step {s_['step_ms']:8.1f} ms  x no_sync {s_['step_over_no_sync']:.3f}  efficiency "
              f"{s_['efficiency']:.3f}  loss {s_['final_loss']:.6f} rel {rel}")
    return {"runs": runs, "summary": summary}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="vpc")
    ap.add_argument("--hosts", default="1,2,4")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--launchers-only", action="store_true")
    ap.add_argument("--launchers", default="harp,torchrun,mpirun,slurm,ray",
                    help="with --launchers-only: the launchers running the harp backend (gloo runs under harp)")
    ap.add_argument("--bucket-caps", default="", help="e.g. 1,25 (DDP bucket_cap_mb study on HARP)")
    ap.add_argument("--compress", default="", help="e.g. 'topk:0.01!' (comm hook study, with --seeds)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--width", type=int, default=0, help="ddp_train.py --width (0: its default)")
    ap.add_argument("--batch", type=int, default=0, help="ddp_train.py --batch, samples per rank (0: its default, 16)")
    ap.add_argument("--ppn", type=int, default=1, help="ranks per host for --hier")
    ap.add_argument("--hier", action="store_true",
                    help="DDP at --hosts x --ppn for each of --variants (interleaved per repetition)")
    ap.add_argument("--variants", default="gloo,harp-flat,harp-auto,harp-rail")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 over gloo and HARP: step time and loss curves")
    ap.add_argument("--efficiency", default="",
                    help="e.g. gloo,harp,harp-fp16,harp-topk: step time against no_sync at --hosts[0]")
    ap.add_argument("--delay", help="one-way delay between hosts for a cluster made here, e.g. 250us (RTT 0.5 ms)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    hosts_list = [int(x) for x in a.hosts.split(",")]
    st = topo.load(a.name)
    made = st is None
    if made:
        st = net.up(a.name, max(hosts_list), rate=a.rate, delay=a.delay)
    try:
        rec = {"stamp_before": stamp(), "command": " ".join(sys.argv),
               "cluster": {k: st.get(k) for k in ("hosts", "rate", "mtu", "congestion", "delay_ns", "delay_line_ns",
                                                  "rtt_asked_us", "rtt_measured_us")}}
        if a.fsdp:
            rec["fsdp"] = fsdp_study(a, a.name, hosts_list[0])
        elif a.efficiency:
            rec["efficiency"] = efficiency_study(a, a.name, hosts_list[0])
        elif a.hier:
            rec["hier"] = hier_study(a, a.name, hosts_list[0])
        elif a.bucket_caps:
            rec["bucket_caps"] = bucket_caps(a, a.name, hosts_list[0])
        elif a.compress:
            rec["compress"] = compress_study(a, a.name, hosts_list[0])
        elif a.launchers_only:
            rec["launchers"] = launchers(a, a.name, hosts_list[0])
        else:
            rec["scaling"] = scaling(a, a.name, hosts_list)
        rec["stamp_after"] = stamp()
        with open(a.out, "w") as f:
            json.dump(rec, f, indent=1)
    finally:
        if made:
            net.down(st)


if __name__ == "__main__":
    main()
