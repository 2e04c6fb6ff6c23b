"""harp-bench interleaved mode: several libraries in the same rank processes, taking turns.

    harp-bench allreduce -np 4 --compare gloo,mpi --interleave 5   (was bench/shm_compare.py)
    harp-bench allreduce -np 2 --torch-overhead                     (was bench/torch_overhead.py)

Each rank process holds every library asked for: HARP (harp.init; "harp:ALGO" is HARP with
algo=ALGO forced, several of them share the communicator), Open MPI
(mpi4py; the job then runs under mpirun), gloo and torch.distributed over
HARP's backend (torch+harp; the default process group, with gloo as a second
group when both run). For each size the libraries take turns, in an order
rotated every turn, so load that comes and goes on a shared machine hits all
alike. Two ways to take turns, as the two scripts did:

  * batches (--interleave REPS): REPS turns of `batch` calls each (enough calls
    that a batch moves ~64 MB, at least 5, at most --max-iters); per turn the
    time per call of the slowest rank; the figure is the median turn
    (shm_compare's semantics).
  * call by call (--torch-overhead: harp, torch+harp, gloo): every call timed
    alone, `iters x rounds` of them; the figure is each rank's median call,
    averaged over ranks (torch_overhead's semantics).

Every library's output is checked with numpy on every rank, out-of-place and
in-place where the library has the form (check.py), before the timing; each
library is timed in the form all of them have (in place where supported).
Each rank writes its samples and wrong counts to OUT.rank<r>; `merge` turns
them into one result per library in harp-bench's usual row format.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from . import check, sweep
from .workers import Case, GlooLib, HarpLib, MpiLib, TorchHarpLib, _progress


def make_libs(a):
    """{name: Lib} for a["libs"], all in this process."""
    import harp

    names = a["libs"]
    out = {}
    comm = harp.init(transport=a.get("transport"))
    if "harp" in names:
        out["harp"] = HarpLib(a, comm)
    for n in names:  # "harp:ALGO": HARP with algo= ALGO forced, on the same communicator
        if n.startswith("harp:"):
            out[n] = HarpLib(dict(a, algo=n[5:]), comm)
    torch_libs = [x for x in names if x in ("gloo", "torch+harp")]
    if torch_libs:
        import torch.distributed as dist

        if "torch+harp" in torch_libs:
            import harp.torch  # noqa: F401  (registers the backend)
        default = "harp" if "torch+harp" in torch_libs else "gloo"
        dist.init_process_group(default, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=comm.rank, world_size=comm.size)
        for name in torch_libs:
            cls = TorchHarpLib if name == "torch+harp" else GlooLib
            group = dist.group.WORLD if cls.backend == default else dist.new_group(backend=cls.backend)
            out[name] = cls(a, group)
    if "mpi" in names:
        out["mpi"] = MpiLib(a)
    return {n: out[n] for n in names}, comm


def _form(lib, coll):
    return "ip" if lib.supports(coll, True) else "oop"


def _batch(a, size):
    if a["call_by_call"]:
        return 1
    return int(max(5, min(a["max_iters"], (64 << 20) // max(size, 1))))


def measure(libs, c, a, size):
    """{lib: [time per call (us) of each turn]} for one size."""
    names = list(libs)
    calls = {n: c.call(libs[n], _form(libs[n], c.coll)) for n in names}
    for n in names:
        c.prime(_form(libs[n], c.coll))
    batch = _batch(a, size)
    turns = a["iters"] * a["rounds"] if a["call_by_call"] else a["reps"]
    for n in names:  # warm up
        for _ in range(max(1, a["warmup"] if a["call_by_call"] else batch // 4)):
            calls[n]()
    samples = {n: [] for n in names}
    for n in names:
        libs[n].barrier()
    for t in range(turns):
        for n in names[t % len(names):] + names[:t % len(names)]:
            if not a["call_by_call"]:
                libs[n].barrier()
            fn = calls[n]
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            samples[n].append((time.perf_counter() - t0) / batch * 1e6)
    return samples, batch


def run(a, libs, rank, nranks):
    rows = []
    sizes = sweep.sizes(a["minbytes"], a["maxbytes"], a["factor"], a["step"])
    for i, size in enumerate(sizes):
        c = Case(a, size, rank, nranks)
        row = {"size": size, "count": c.count, "libs": {}}
        for n, lib in libs.items():
            r = row["libs"][n] = {"form": _form(lib, c.coll)}
            for mode in ("oop", "ip"):
                r[f"{mode}_wrong"] = None
                if lib.supports(c.coll, mode == "ip"):
                    r[f"{mode}_wrong"], note = c.check(lib, mode)
                    if note:
                        r[f"{mode}_note"] = note
            r.update(lib.describe(c.coll, c.count, a["dtype"]))
        samples, row["batch"] = measure(libs, c, a, size)
        for n in libs:
            row["libs"][n]["samples"] = samples[n]
        rows.append(row)
        if rank == 0:
            _progress(a.get("progress"), "+".join(libs), i + 1, len(sizes), size)
    return rows


def main(a):
    libs, comm = make_libs(a)
    rows = run(a, libs, comm.rank, comm.size)
    check.write_rank(a["out"], "interleave", comm.rank, comm.size, rows)
    for lib in libs.values():
        if not isinstance(lib, HarpLib):
            lib.close()
    if any(n in libs for n in ("gloo", "torch+harp")):
        import torch.distributed as dist

        dist.destroy_process_group()
    comm.destroy()
    return 0


def _figure(per_rank, call_by_call):
    """per_rank: [[us per turn] per rank] -> (figure, min)."""
    if call_by_call:  # each rank's median call, averaged over ranks
        return (sum(statistics.median(s) for s in per_rank) / len(per_rank),
                sum(min(s) for s in per_rank) / len(per_rank))
    slowest = [max(t) for t in zip(*per_rank)]  # per turn, the slowest rank
    return statistics.median(slowest), min(slowest)


def merge(out, nranks, call_by_call):
    """The ranks' files -> {lib: result in harp-bench's row format (+ "min_us", "turns", "batch")}."""
    parts = []
    for r in range(nranks):
        try:
            parts.append(check.load_rank(out, r))
        except (OSError, ValueError) as e:
            raise RuntimeError(f"interleaved run: rank {r} reported no results ({e})") from None
    names = list(parts[0]["rows"][0]["libs"]) if parts[0]["rows"] else []
    results = {}
    for n in names:
        rows = []
        for i, row in enumerate(parts[0]["rows"]):
            libr = [p["rows"][i]["libs"][n] for p in parts]
            form = libr[0]["form"]
            us, mn = _figure([x["samples"] for x in libr], call_by_call)
            m = {"size": row["size"], "count": row["count"], "oop_us": None, "ip_us": None, f"{form}_us": us,
                 "min_us": mn, "turns": len(libr[0]["samples"]), "batch": row["batch"]}
            for mode in ("oop", "ip"):
                w = [x.get(f"{mode}_wrong") for x in libr]
                m[f"{mode}_wrong"] = None if all(v is None for v in w) else sum(v or 0 for v in w)
                notes = [f"rank {r}: {x[f'{mode}_note']}" for r, x in enumerate(libr) if x.get(f"{mode}_note")]
                if notes:
                    m[f"{mode}_note"] = "; ".join(notes)
            for k in ("transport", "algo"):
                if k in libr[0]:
                    m[k] = libr[0][k]
            rows.append(m)
        used = sorted({r["transport"] for r in rows if r.get("transport")})
        results[n] = {"lib": n, "nranks": nranks, "transport": "+".join(used) or n, "rows": rows}
    return results


if __name__ == "__main__":  # python -m harp_dev.bench.interleave interleave <json-args>, as harp-bench launches it
    if len(sys.argv) != 3 or sys.argv[1] != "interleave":
        sys.exit("run through harp-bench --interleave / --torch-overhead")
    main(json.loads(sys.argv[2]))
