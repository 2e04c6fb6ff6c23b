"""harp-bench: nccl-tests-style sweeps of HARP collectives, optionally side by side
with gloo (torch.distributed) and Open MPI (mpi4py) in the same run.

    harp-bench allreduce                         # 2 local ranks, 8 B .. 64 MB, float sum
    harp-bench allreduce -np 4 -b 8 -e 64M -f 4 --compare gloo,mpi
    harp-bench broadcast -np 3 -r 1 -d double --json out.json
    harp-bench allreduce -np 4 --compare gloo,mpi --interleave 5 --mpi-bind core   # all in the same ranks
    harp-bench allreduce -np 2 --torch-overhead          # raw harp vs torch+harp vs torch+gloo, call by call
    sudo harp-bench allreduce --veth --compare gloo      # DPDK vs TCP on a veth between namespaces
    harp-bench allreduce --compare gloo,mpi,torch --plot busbw.png --json out.json

Flags follow nccl-tests: -b/-e/-f/-i sizes, -n iterations, -w warmup, -c check,
-d datatype, -o op, -r root. `-n` keeps its nccl-tests meaning (iterations), so
the number of local ranks is `-np` (as with mpirun). Under a launcher (harp-run,
torchrun, mpirun) harp-bench runs as one rank of that job instead of starting
its own.

Every result of every library is checked with numpy against the expected value
computed on each rank (out-of-place and in-place; check.py), and the verdict
never travels through the library measured: harp-bench's own ranks report
through files, ranks under a launcher through their exit status. Any wrong
value: the failing library, size and form on stderr, exit status 1 (under a
launcher: every rank that saw one exits 1, so the launcher fails too).

--json stamps the results with the git commit, CPU model, core count, load
average, UTC time, command line, and transport and algorithms actually used.
--plot FILE.png draws bus bandwidth against size, one line per library.
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

from . import check, sweep
from harp._version import __version__


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
    ap.add_argument("--compare", "--peers", dest="compare", default="",
                    help="comma list of peers to run the same sweep through: gloo, mpi (Open MPI via mpi4py), "
                         "torch (torch.distributed over HARP's backend: the torch path's overhead)")
    ap.add_argument("--interleave", type=int, metavar="REPS", default=0,
                    help="run harp and the --compare peers in the same rank processes, taking turns in batches, "
                         "REPS turns per size, median turn of the slowest rank (bench/shm_compare.py's method)")
    ap.add_argument("--mpi-bind", choices=["none", "core"], default="none",
                    help="placement of mpirun's ranks (peer mpi, --interleave with mpi): none (default) or core "
                         "(--map-by core --bind-to core:overload-allowed: rank i on core i mod cores)")
    ap.add_argument("--max-iters", type=int, default=200, help="--interleave: most calls per batch (default 200)")
    ap.add_argument("--torch-overhead", action="store_true",
                    help="harp, torch+harp and torch+gloo in the same ranks, interleaved call by call, "
                         "-n x --rounds calls per size, median call averaged over ranks (bench/torch_overhead.py)")
    ap.add_argument("--rounds", type=int, help="--torch-overhead: rounds of -n calls (default 5); "
                                                  "--veth: interleaved rounds, best time kept (default 2)")
    ap.add_argument("--veth", action="store_true",
                    help="HARP over DPDK vs HARP over TCP (and --compare gloo) on a veth between network "
                         "namespaces, one rank each (root, dpdk build, source checkout; was bench/dpdk_veth.py)")
    ap.add_argument("--pmd", default="af_xdp", help="--veth: DPDK driver on the veth (af_xdp, af_packet)")
    ap.add_argument("--mtu", type=int, default=1500, help="--veth: data veth MTU (default 1500)")
    ap.add_argument("--json", help="write all results as JSON to this file (stamped: commit, host, load, time)")
    ap.add_argument("--plot", help="draw busbw against size, one line per library, into this PNG (matplotlib)")
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
    a.compare = [PEER_ALIASES.get(x, x) for x in a.compare.split(",") if x]
    for x in a.compare:
        if x not in PEERS:
            ap.error(f"--compare: unknown peer '{x}' (gloo, mpi, torch)")
    if a.torch_overhead:
        a.compare = ["torch+harp", "gloo"]
    if a.rounds is None:
        a.rounds = 2 if a.veth else 5
    if a.veth and (a.interleave or a.torch_overhead or set(a.compare) - {"gloo"}):
        ap.error("--veth runs harp-dpdk, harp-tcp and (with --compare gloo) gloo; no other mode or peer")
    return a


# --compare name -> worker library name; and the peers in the order they run and print.
PEER_ALIASES = {"torch": "torch+harp", "ompi": "mpi"}
PEERS = ("gloo", "mpi", "torch+harp")


def worker_args(a, out):
    libs = ["harp"] + [p for p in PEERS if p in a.compare]
    return {"libs": libs, "reps": a.interleave, "call_by_call": a.torch_overhead, "rounds": a.rounds,
            "max_iters": a.max_iters,"coll": a.collective, "minbytes": a.minbytes, "maxbytes": a.maxbytes, "factor": a.stepfactor,
            "step": a.stepbytes, "iters": a.iters, "warmup": a.warmup_iters, "check": a.check,
            "dtype": sweep.TYPES[a.datatype], "op": a.op, "root": a.root, "algo": a.algo,
            "transport": a.transport, "out": out, "progress": progress_mode(a)}


def progress_mode(a):
    """'tty' (\\r-overwritten line) only when both outputs are terminals; 'lines' in logs and pipes."""
    if a.no_progress:
        return "none"
    return "tty" if sys.stdout.isatty() and sys.stderr.isatty() else "lines"


def _worker_cmd(a, lib, out):
    # interleave drives every library from one rank process (harp_dev.bench.interleave, above workers)
    mod = "harp_dev.bench.interleave" if lib == "interleave" else "harp_dev.bench.workers"
    return [sys.executable, "-m", mod, lib, json.dumps(worker_args(a, out))]


def _collect(a, lib, out, rc, what):
    """The merged per-rank results of one library; raises _Failed when its ranks failed or reported nothing."""
    if rc != 0:
        raise _Failed(f"{lib}: {what} failed (status {rc})")
    try:
        return check.merge(out, lib, a.nranks)
    except RuntimeError as e:
        raise _Failed(str(e)) from None


class _Failed(Exception):
    """A library's ranks failed or reported nothing: harp-bench names it and exits 1."""


def run_harp(a, tmp):
    from harp.launch import spawn

    out = os.path.join(tmp, "harp.json")
    env = {"HARP_TRANSPORT": a.transport} if a.transport else {}
    return _collect(a, "harp", out, spawn(a.nranks, _worker_cmd(a, "harp", out), env), "HARP ranks")


def _torch_missing(lib):
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"# {lib}: torch is not installed (bash scripts/install-deps.sh --compare); skipped", file=sys.stderr)
        return True
    return False


def run_torch(a, tmp, lib):
    """gloo, or torch+harp (torch.distributed over HARP's backend): torchrun-style env:// ranks."""
    if _torch_missing(lib):
        return None
    out = os.path.join(tmp, lib + ".json")
    port = _free_port()
    procs = []
    for r in range(a.nranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(a.nranks), LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo")
        if a.transport:
            env["HARP_TRANSPORT"] = a.transport
        procs.append(subprocess.Popen(_worker_cmd(a, lib, out), env=env))
    rcs = [p.wait() for p in procs]
    return _collect(a, lib, out, max(rcs, key=abs), f"ranks {rcs}")


def _mpi_bind(a):
    return ["--map-by", "core", "--bind-to", "core:overload-allowed"] if a.mpi_bind == "core" else ["--bind-to", "none"]


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
    cmd = [mpirun, "-np", str(a.nranks), "--oversubscribe"] + _mpi_bind(a)
    # e.g. HARP_BENCH_MPI_MCA="btl=tcp,self" to hold Open MPI to TCP (';' separates several).
    mca = os.environ.get("HARP_BENCH_MPI_MCA", "")
    for item in [x for x in mca.split(";") if x]:
        k, v = item.split("=", 1)
        cmd += ["--mca", k, v]
    return _collect(a, "mpi", out, subprocess.call(cmd + _worker_cmd(a, "mpi", out), env=env), "mpirun")


def print_table(a, res, label, scope="summed over ranks"):
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
    print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'} ({scope}, checked with numpy)")
    if bws:
        print(f"# Avg bus bandwidth    : {sum(bws) / len(bws):.4f}")
    print("#")


def print_compare(a, results):
    """Side by side: time and busbw per library; ratio = peer time / HARP time (> 1: HARP faster).
    Compared on the form each peer supports (gloo: in-place for allreduce/broadcast/reduce)."""
    base = next(k for k in results if results[k])  # harp (harp-dpdk with --veth)
    harp = results[base]
    n = harp["nranks"]
    peers = [k for k in results if k != base and results[k]]
    if not peers:
        return
    head = f"# {'size':>10s} {base + '_us':>10s} {base + '_GB/s':>9s}"
    for p in peers:
        head += f" {p + '_us':>10s} {p + '_GB/s':>9s} {'x' + p:>7s}"
    print(f"# Comparison, {a.collective}, {n} ranks, {sweep.TYPES[a.datatype]} {a.op}: time per call (us), busbw,"
          f" and speed-up x = peer time / {base} time")
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


def run_interleaved(a, tmp):
    """--interleave / --torch-overhead: every library in the same ranks (interleave.py); (results, failures)."""
    from harp.comm import get_unique_id
    from harp.launch import spawn
    from .interleave import merge

    out = os.path.join(tmp, "interleave.json")
    args = worker_args(a, out)
    if ("gloo" in args["libs"] or "torch+harp" in args["libs"]) and _torch_missing("+".join(args["libs"])):
        return {}, ["torch is needed for the gloo / torch+harp peers"]
    cmd = _worker_cmd(a, "interleave", out)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "GLOO_SOCKET_IFNAME": "lo"}
    if a.transport:
        env["HARP_TRANSPORT"] = a.transport
    if "mpi" in args["libs"]:
        uid = get_unique_id("127.0.0.1:0")  # served from here while mpirun runs
        env.update(HARP_UNIQUE_ID=uid.hex(), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HARP_RANK", "RANK", "WORLD_SIZE"))}
        if not shutil.which("mpirun"):
            return {}, ["--interleave with mpi: mpirun is not installed (bash scripts/install-deps.sh --compare)"]
        rc = subprocess.call([shutil.which("mpirun"), "-np", str(a.nranks), "--oversubscribe"] + _mpi_bind(a) + cmd,
                             env=dict(base, **env))
    else:
        rc = spawn(a.nranks, cmd, env)
    if rc != 0:
        return {}, [f"interleaved run of {'+'.join(args['libs'])}: ranks failed (status {rc})"]
    try:
        results = merge(out, a.nranks, a.torch_overhead)
    except RuntimeError as e:
        return {}, [str(e)]
    for lib, res in results.items():
        print_table(a, res, lib)
    return results, []


def run_veth(a, tmp):
    from . import veth

    results, failed, pps = veth.run(a, tmp, worker_args)
    for lib, res in results.items():
        print_table(a, res, lib)
    print(f"# Packet rate (harp_dpdk_selftest --bench SIZE, {a.pmd}; rank 0 sender / rank 1 receiver):")
    for line in pps:
        print(f"#   {line}")
    return results, failed


def run_under_launcher(a, argv):
    """One rank of someone else's job (harp-run, torchrun, mpirun): the HARP sweep, checked on this
    rank; rank 0 prints the table (its own #wrong), every rank with a wrong value exits 1."""
    from .workers import HarpLib, run_sweep

    tmp = tempfile.mkdtemp(prefix="harp-bench-")
    args = worker_args(a, os.path.join(tmp, "harp.json"))
    lib = HarpLib(args)
    rows = run_sweep(lib, args, lib.rank, lib.size, lib.barrier, lib.avg)
    if lib.rank == 0:
        print_table(a, {"nranks": lib.size, "rows": rows}, "harp", scope="rank 0's values; every rank checks its own")
        if a.json:
            used = sorted({r["transport"] for r in rows if r.get("transport")})
            write_json(a, argv, {"harp": {"lib": "harp", "nranks": lib.size, "transport": "+".join(used),
                                          "rows": rows}})
    lib.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return check.exit_status("harp", lib.rank, rows, sys.stderr)


def write_json(a, argv, results):
    from .stamp import stamp

    harp = results.get("harp") or {}
    algos = {r.get("algo") for r in harp.get("rows", []) if r.get("algo")}
    with open(a.json, "w") as f:
        json.dump({"stamp": stamp(argv, harp.get("transport"), algos), "args": vars(a), "results": results}, f,
                  indent=1)


def run_all(a, tmp):
    """Every library asked for, each checked; (results, failures)."""
    results, failed = {}, []
    runners = [("harp", lambda: run_harp(a, tmp))]
    for p in PEERS:
        if p in a.compare:
            runners.append((p, (lambda: run_mpi(a, tmp)) if p == "mpi" else (lambda p=p: run_torch(a, tmp, p))))
    for lib, fn in runners:
        try:
            results[lib] = fn()
        except _Failed as e:
            failed.append(str(e))
            results[lib] = None
        if results[lib]:
            print_table(a, results[lib], lib)
    return results, failed


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if _under_launcher():
        sys.exit(run_under_launcher(a, argv))
    # Ranks usually outnumber cores here: numpy's OpenBLAS (and OpenMP) worker threads in every rank
    # would spin next to them (perf: 9% of a 2-rank shm run in blas_thread_server). Every library's
    # ranks get the same setting unless the user chose one.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    with tempfile.TemporaryDirectory(prefix="harp-bench-") as tmp:
        if a.veth:
            results, failed = run_veth(a, tmp)
        else:
            results, failed = (run_interleaved if a.interleave or a.torch_overhead else run_all)(a, tmp)
    if len([r for r in results.values() if r]) > 1:
        print_compare(a, results)
    if a.json:
        write_json(a, argv, results)
    if a.plot:
        from .plot import plot

        plot(a.plot, a.collective, results, f"{a.collective}, {a.nranks} ranks, {sweep.TYPES[a.datatype]} {a.op}")
    failed += check.failures(results)
    for line in failed:
        print(f"harp-bench: FAILED {line}", file=sys.stderr)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
