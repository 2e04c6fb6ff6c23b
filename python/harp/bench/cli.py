"""harp-bench: nccl-tests-style sweeps of HARP collectives, optionally side by side
with gloo (torch.distributed) and Open MPI (mpi4py) in the same run.

    harp-bench allreduce                         # 2 local ranks, 8 B .. 64 MB, float sum
    harp-bench allreduce -np 4 -b 8 -e 64M -f 4 --compare gloo,mpi
    harp-bench broadcast -np 3 -r 1 -d double --json out.json

Flags follow nccl-tests: -b/-e/-f/-i sizes, -n iterations, -w warmup, -c check,
-d datatype, -o op, -r root. `-n` keeps its nccl-tests meaning (iterations), so
the number of local ranks is `-np` (as with mpirun). Under a launcher (harp-run,
torchrun, mpirun) harp-bench runs as one rank of that job instead of starting
its own.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

from . import sweep
from .._version import __version__


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _under_launcher():
    return any(v in os.environ for v in ("HARP_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")) or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ)


def parse(argv):
    ap = argparse.ArgumentParser(prog="harp-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"harp-bench (harp {__version__})")
    ap.add_argument("collective", choices=sweep.COLLECTIVES)
    ap.add_argument("-np", "--nranks", type=int, default=2, help="local ranks to start when no launcher did (default 2)")
    ap.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    ap.add_argument("-e", "--maxbytes", default="64M", help="largest size (default 64M)")
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply size by this (default 2)")
    ap.add_argument("-i", "--stepbytes", default="0", help="add this to size instead of -f")
    ap.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    ap.add_argument("-w", "--warmup_iters", type=int, default=5, help="warmup iterations (default 5)")
    ap.add_argument("-c", "--check", type=int, default=1, help="check results (default 1)")
    ap.add_argument("-d", "--datatype", default="float", help="nccl-tests type name (default float)")
    ap.add_argument("-o", "--op", default="sum", choices=["sum", "prod", "min", "max", "avg"])
    ap.add_argument("-r", "--root", type=int, default=0)
    ap.add_argument("--algo", help="force a HARP algorithm (see docs/algorithms.md)")
    ap.add_argument("--transport", help="force a HARP transport (tcp, shm, dpdk, verbs)")
    ap.add_argument("--compare", default="", help="comma list of peers to run the same sweep through: gloo,mpi")
    ap.add_argument("--json", help="write all results as JSON to this file")
    ap.add_argument("--csv", action="store_true", help="print CSV instead of the nccl-tests table")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress on stderr (default: a \\r line on a terminal, plain lines otherwise)")
    a = ap.parse_args(argv)
    a.minbytes, a.maxbytes, a.stepbytes = (sweep.parse_size(a.minbytes), sweep.parse_size(a.maxbytes),
                                           sweep.parse_size(a.stepbytes))
    if a.minbytes > a.maxbytes:
        ap.error("-b must not exceed -e")
    if a.nranks < 1:
        ap.error("-np must be >= 1")
    sweep.numpy_dtype(a.datatype)
    a.compare = [x for x in a.compare.split(",") if x]
    for x in a.compare:
        if x not in ("gloo", "mpi"):
            ap.error(f"--compare: unknown peer '{x}' (gloo, mpi)")
    return a


def worker_args(a, out):
    return {"coll": a.collective, "minbytes": a.minbytes, "maxbytes": a.maxbytes, "factor": a.stepfactor,
            "step": a.stepbytes, "iters": a.iters, "warmup": a.warmup_iters, "check": a.check,
            "dtype": sweep.TYPES[a.datatype], "op": a.op, "root": a.root, "algo": a.algo,
            "transport": a.transport, "out": out, "progress": progress_mode(a)}


def progress_mode(a):
    """'tty' (\\r-overwritten line) only when both outputs are terminals; 'lines' in logs and pipes."""
    if a.no_progress:
        return "none"
    return "tty" if sys.stdout.isatty() and sys.stderr.isatty() else "lines"


def run_harp(a, tmp):
    from ..launch import spawn

    out = os.path.join(tmp, "harp.json")
    cmd = [sys.executable, "-m", "harp.bench.workers", "harp", json.dumps(worker_args(a, out))]
    env = {"HARP_TRANSPORT": a.transport} if a.transport else {}
    rc = spawn(a.nranks, cmd, env)
    if rc != 0:
        raise SystemExit(f"harp-bench: HARP ranks failed (status {rc})")
    return json.load(open(out))


def run_gloo(a, tmp):
    try:
        import torch  # noqa: F401
    except ImportError:
        print("# gloo: torch is not installed (bash scripts/install-deps.sh --compare); skipped", file=sys.stderr)
        return None
    out = os.path.join(tmp, "gloo.json")
    cmd = [sys.executable, "-m", "harp.bench.workers", "gloo", json.dumps(worker_args(a, out))]
    port = _free_port()
    procs = []
    for r in range(a.nranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(a.nranks), LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen(cmd, env=env))
    rcs = [p.wait() for p in procs]
    if any(rcs):
        print(f"# gloo: ranks failed {rcs}; skipped", file=sys.stderr)
        return None
    return json.load(open(out))


def run_mpi(a, tmp):
    mpirun = shutil.which("mpirun")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpirun = None
    if not mpirun:
        print("# mpi: mpirun or mpi4py missing (bash scripts/install-deps.sh --compare); skipped", file=sys.stderr)
        return None
    out = os.path.join(tmp, "mpi.json")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for k in [k for k in env if k.startswith(("HARP_RANK", "HARP_UNIQUE", "RANK", "WORLD_SIZE"))]:
        del env[k]
    cmd = [mpirun, "-np", str(a.nranks), "--oversubscribe", "--bind-to", "none"]
    # e.g. HARP_BENCH_MPI_MCA="btl=tcp,self" to hold Open MPI to TCP (';' separates several).
    mca = os.environ.get("HARP_BENCH_MPI_MCA", "")
    for item in [x for x in mca.split(";") if x]:
        k, v = item.split("=", 1)
        cmd += ["--mca", k, v]
    cmd += [sys.executable, "-m", "harp.bench.workers", "mpi", json.dumps(worker_args(a, out))]
    rc = subprocess.call(cmd, env=env)
    if rc:
        print(f"# mpi: mpirun failed ({rc}); skipped", file=sys.stderr)
        return None
    return json.load(open(out))


def print_table(a, res, label):
    n = res["nranks"]
    dt = sweep.TYPES[a.datatype]
    if a.csv:
        print("lib,size,count,type,redop,root,oop_us,oop_busbw,oop_wrong,ip_us,ip_busbw,ip_wrong")
        for r in res["rows"]:
            print(",".join(str(x) for x in (label, r["size"], r["count"], dt, a.op, a.root, r.get("oop_us"),
                                             sweep.busbw(a.collective, r, n, "oop_us"), r.get("oop_wrong"),
                                             r.get("ip_us"), sweep.busbw(a.collective, r, n, "ip_us"),
                                             r.get("ip_wrong"))))
        return
    print(sweep.header(a.collective, n, dt, a.op, a.root, a.iters, a.warmup_iters, label))
    for r in res["rows"]:
        print(sweep.fmt_row(a.collective, r, n, dt, a.op, a.root))
    wrong = sum((r.get("oop_wrong") or 0) + (r.get("ip_wrong") or 0) for r in res["rows"])
    bws = [sweep.busbw(a.collective, r, n, "ip_us") for r in res["rows"]]
    bws = [b for b in bws if b]
    print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    if bws:
        print(f"# Avg bus bandwidth    : {sum(bws) / len(bws):.4f}")
    print("#")


def print_compare(a, results):
    """Side by side: time and busbw per library; ratio = peer time / HARP time (> 1: HARP faster).
    Compared on the form each peer supports (gloo: in-place for allreduce/broadcast/reduce)."""
    harp = results["harp"]
    n = harp["nranks"]
    peers = [k for k in results if k != "harp" and results[k]]
    head = f"# {'size':>10s} {'harp_us':>10s} {'harp_GB/s':>9s}"
    for p in peers:
        head += f" {p + '_us':>10s} {p + '_GB/s':>9s} {'x' + p:>7s}"
    print(f"# Comparison, {a.collective}, {n} ranks, {sweep.TYPES[a.datatype]} {a.op}: time per call (us), busbw,"
          f" and speed-up x = peer time / HARP time")
    print(head)
    for i, hr in enumerate(harp["rows"]):
        line = ""
        hk = "ip_us" if hr.get("ip_us") else "oop_us"
        line += f"  {hr['size']:>10d} {hr[hk]:10.2f} {sweep.busbw(a.collective, hr, n, hk) or 0:9.3f}"
        for p in peers:
            pr = results[p]["rows"][i]
            key = "ip_us" if pr.get("ip_us") else "oop_us"
            hk2 = key if hr.get(key) else hk
            t = pr.get(key)
            if not t:
                line += f" {'n/a':>10s} {'':>9s} {'':>7s}"
                continue
            line += f" {t:10.2f} {sweep.busbw(a.collective, pr, n, key) or 0:9.3f} {t / hr[hk2]:7.2f}"
        print(line)


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    if _under_launcher():
        # One rank of someone else's job: run the HARP sweep directly.
        from .workers import HarpLib, run_sweep

        tmp = tempfile.mkdtemp(prefix="harp-bench-")
        args = worker_args(a, os.path.join(tmp, "harp.json"))
        lib = HarpLib(args)
        rows = run_sweep(lib, args, lib.rank, lib.size, lib.barrier, lib.avg)
        if lib.rank == 0:
            print_table(a, {"nranks": lib.size, "rows": rows}, "harp")
        lib.comm.destroy()
        return
    with tempfile.TemporaryDirectory(prefix="harp-bench-") as tmp:
        results = {"harp": run_harp(a, tmp)}
        print_table(a, results["harp"], "harp")
        if "gloo" in a.compare:
            results["gloo"] = run_gloo(a, tmp)
            if results["gloo"]:
                print_table(a, results["gloo"], "gloo")
        if "mpi" in a.compare:
            results["mpi"] = run_mpi(a, tmp)
            if results["mpi"]:
                print_table(a, results["mpi"], "mpi")
        if a.compare:
            print_compare(a, results)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "results": results}, f, indent=1)
        wrong = sum((r.get("oop_wrong") or 0) + (r.get("ip_wrong") or 0) for r in results["harp"]["rows"])
        if wrong:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
