"""Coalesced allreduce (tensor fusion): 64 float32 tensors of 4 KB-2 MB (32 MB in all)
as one allreduce_coalesced call, against one allreduce of the same 32 MB already flat, and 64
separate allreduce calls; side by side in one job, iterations interleaved.

    python3 bench/coalesced_bench.py --where local --ranks 4 --iters 10 --repeat 3 \\
        --out results/arena/coalesced-local.json
    python3 bench/coalesced_bench.py --where arena --ranks 4 --rate 1gbit --iters 5 --repeat 3 \\
        --out results/arena/coalesced-arena.json

At round-trip time (the issue's goal: coalesced >= 3 x faster than 64 separate calls at RTT 1 ms,
through torch's all_reduce_coalesced and NCCL groups too), with gloo and Open MPI beside HARP:

    python3 bench/coalesced_bench.py --where arena --name coalrtt --ranks 4 --delay 500us \
        --only coalesced/separate --with nccl,torch,mpi --iters 5 --repeat 3 \
        --out results/arena/coalesced-rtt1ms.json

--with adds families of (coalesced, separate) pairs, each ratio separate / coalesced reported:
nccl (harp.nccl, 64 allReduce inside groupStart/groupEnd vs outside), torch (torch.distributed
all_reduce_coalesced vs 64 all_reduce, on the harp backend and on gloo in the same job), mpi
(mpi4py under the arena's mpirun: 64 Iallreduce + Waitall vs 64 Allreduce; its own job, right
after HARP's in each repetition).

local: --ranks ranks over loopback tcp (harp-run). arena: harp-cluster --name (default coal17,
taken down at the end, also on failure), one rank per host, link payload rate measured first
(bench/vpc/linkrate.py). Modes: flat (one 32 MB allreduce), coalesced (the default,
HARP_COALESCE=sg: one ring schedule over the 64 arrays, no copies), fused (HARP_COALESCE=fuse
with its defaults: HARP_FUSION_BYTES 64M, HARP_FUSION_ALONE_BYTES 128K), coalesced_F_A (fuse
with an F MB buffer, arrays of A KB or more alone: 64_512, 64_4096 = everything fused into one
allreduce, 8_128 = 4 MB chunks whose packing overlaps the reductions), separate (64 blocking calls). Per mode: median over
repetitions of (median over iterations of the slowest rank's time), min..max, busbw
(2(p-1)/p x 32 MB / time), its fraction of the link (arena), and the ratios
coalesced / flat (target <= 1.1) and separate / coalesced (target >= 3). One JSON stamped
before and after (bench/vpc/stamp.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.abspath(os.path.join(HERE, "..", "python"))
sys.path.insert(0, PYDIR)
sys.path.insert(0, os.path.join(HERE, "vpc"))
from stamp import stamp, write_record  # noqa: E402

# "coalesced": the defaults (HARP_COALESCE=sg, one list schedule, no copies); "fused": HARP_COALESCE=fuse
# with its defaults; coalesced_F_A: fuse with HARP_FUSION_BYTES F (MB), HARP_FUSION_ALONE_BYTES A (KB)
MODES = ["flat", "coalesced", "fused", "coalesced_64_512", "coalesced_64_4096", "coalesced_8_128", "separate"]
# --with: further families, each a (coalesced, separate) pair compared in the same job
FAMILIES = {"nccl": ["nccl_group", "nccl_separate"],                      # harp.nccl: ncclGroupStart/End
            "torch": ["torch_harp_coalesced", "torch_harp_separate",      # torch.distributed, harp backend
                      "torch_gloo_coalesced", "torch_gloo_separate"],     # and gloo in the same job
            "mpi": ["mpi_nonblocking", "mpi_separate"]}                   # separate job under mpirun
PAIRS = [("separate", "coalesced"), ("nccl_separate", "nccl_group"), ("torch_harp_separate", "torch_harp_coalesced"),
         ("torch_gloo_separate", "torch_gloo_coalesced"), ("mpi_separate", "mpi_nonblocking")]
TOTAL = 32 << 20

# The timing loop both workers share: a warm-up call per mode, then `iters` rounds of every mode in
# turn, each after a barrier; each rank writes its times to <out>.rank<r>.
TIMING_LOOP = r'''
res = {m: [] for m in modes}
for m in modes:
    run(m)  # warm-up: connections, buffers
for _ in range(iters):
    for m in modes:
        barrier()
        a = time.perf_counter()
        run(m)
        res[m].append(time.perf_counter() - a)
with open(f"{out}.rank{rank}", "w") as f:
    json.dump({"times_s": res}, f)
'''

WORKER = r'''
import json, os, sys, time
import numpy as np
import harp
from harp.coalesce import FusionState

out, iters, sizes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
modes = sys.argv[4].split("/")
comm = harp.init()
flat = np.zeros(sum(sizes) // 4, np.float32)  # zeros: no overflow however many iterations
ts = [np.zeros(s // 4, np.float32) for s in sizes]

if any(m.startswith("nccl_") for m in modes):  # harp.nccl (cupy.cuda.nccl's API) on host memory
    from harp import nccl
    uid = np.zeros(nccl.NCCL_UNIQUE_ID_BYTES, np.uint8)
    if comm.rank == 0:
        uid[:] = [b % 256 for b in nccl.get_unique_id()]
    comm.broadcast(uid, root=0)
    nc = nccl.NcclCommunicator(comm.size, bytes(uid), comm.rank)
if any(m.startswith("torch_") for m in modes):  # torch.distributed: the harp backend and gloo beside it
    import warnings
    import torch
    import torch.distributed as dist
    import harp.torch  # noqa: F401  (registers the backend)
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_reduce_coalesced's deprecation notice
    torch.set_num_threads(1)
    dist.init_process_group("harp", rank=comm.rank, world_size=comm.size)
    groups = {"harp": None, "gloo": dist.new_group(backend="gloo")}
    tts = [torch.zeros(s // 4) for s in sizes]

def run(mode):
    if mode.startswith("nccl_"):
        if mode == "nccl_group":
            nccl.groupStart()
        for t in ts:
            nc.allReduce(t, t, t.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        if mode == "nccl_group":
            nccl.groupEnd()
    elif mode.startswith("torch_"):
        _, lib, how = mode.split("_")
        if how == "coalesced":
            dist.all_reduce_coalesced(tts, group=groups[lib])
        else:
            for t in tts:
                dist.all_reduce(t, group=groups[lib])
    elif mode == "flat":
        comm.allreduce(flat)
    elif mode == "separate":
        for t in ts:
            comm.allreduce(t)
    else:
        os.environ["HARP_COALESCE"] = "sg" if mode == "coalesced" else "fuse"
        calls = comm.calls
        if calls.fusion is None:
            calls.fusion = FusionState()
        if mode.startswith("coalesced_"):
            f, al = mode.split("_")[1:]
            calls.fusion.set_sizes((int(f) << 20) // 2, int(al) << 10)
        else:
            calls.fusion.set_sizes()  # the defaults (HARP_FUSION_BYTES, HARP_FUSION_ALONE_BYTES)
        comm.allreduce_coalesced(ts)

barrier, rank = comm.barrier, comm.rank
''' + TIMING_LOOP + r'''if any(m.startswith("torch_") for m in modes):
    dist.destroy_process_group()
comm.destroy()
'''

# Open MPI (mpi4py, TCP BTL) under the arena's mpirun: 64 blocking Allreduce calls, and the same 64
# as Iallreduce + Waitall (MPI's way to have them in flight together).
MPI_WORKER = r'''
import json, sys, time
import numpy as np
from mpi4py import MPI

out, iters, sizes, modes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4].split("/")
w = MPI.COMM_WORLD
ts = [np.zeros(s // 4, np.float32) for s in sizes]

def run(mode):
    if mode == "mpi_separate":
        for t in ts:
            w.Allreduce(MPI.IN_PLACE, t)
    else:
        MPI.Request.Waitall([w.Iallreduce(MPI.IN_PLACE, t) for t in ts])

barrier, rank = w.Barrier, w.rank
''' + TIMING_LOOP + r''''''


def tensor_sizes(n=64, lo=4 << 10, hi=2 << 20, total=TOTAL):
    """n sizes (multiples of 4 bytes) from lo to hi, s_i = lo + (hi - lo) (i/(n-1))^a with a chosen so
    they sum to `total`, in a fixed shuffled order (mixed sizes, as in a model's gradient list)."""
    def sizes(a):
        return [int(lo + (hi - lo) * (i / (n - 1)) ** a) // 4 * 4 for i in range(n)]
    a_lo, a_hi = 0.01, 50.0
    for _ in range(100):
        mid = (a_lo + a_hi) / 2
        a_lo, a_hi = (mid, a_hi) if sum(sizes(mid)) > total else (a_lo, mid)
    s = sizes(a_hi)
    s[n // 2] += total - sum(s)
    order = sorted(range(n), key=lambda i: (i * 37) % n)
    return [s[i] for i in order]


def run_job(prefix, tmp, tag, iters, sizes, env, timeout, modes, source=None):
    worker = os.path.join(tmp, tag + ".py")
    with open(worker, "w") as f:
        f.write(source or WORKER)
    out = os.path.join(tmp, tag)
    cmd = prefix + [sys.executable, worker, out, str(iters), json.dumps(sizes), "/".join(modes)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{tag} failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-3000:]}")
    ranks = sorted(x for x in os.listdir(tmp) if x.startswith(tag + ".rank"))
    return [json.load(open(os.path.join(tmp, x))) for x in ranks]


def summarise(reps, p, link):
    out = {}
    for m in reps[0][0]["times_s"]:
        per_rep = []
        for rep in reps:
            slowest = [max(rank["times_s"][m][i] for rank in rep) for i in range(len(rep[0]["times_s"][m]))]
            per_rep.append(statistics.median(slowest))
        med = statistics.median(per_rep)
        busbw = 2 * (p - 1) / p * TOTAL / med / 1e6
        out[m] = {"s_median": med, "s_min": min(per_rep), "s_max": max(per_rep), "per_rep_s": per_rep,
                  "busbw_MBps": busbw, "busbw_over_link": busbw / link if link else None}
    ratios = {}
    for m in out:
        if m.startswith("coalesced") and "flat" in out and "separate" in out:
            ratios[f"{m}_over_flat"] = out[m]["s_median"] / out["flat"]["s_median"]
            ratios[f"separate_over_{m}"] = out["separate"]["s_median"] / out[m]["s_median"]
    for sep, co in PAIRS:
        if sep in out and co in out:
            ratios[f"{sep}_over_{co}"] = out[sep]["s_median"] / out[co]["s_median"]
    return {"modes": out, "ratios": ratios}


def print_table(title, summ):
    print(f"## {title}")
    print(f"{'mode':>22} {'median s':>9} {'min..max s':>17} {'busbw MB/s':>10} {'/link':>6}")
    for m, r in summ["modes"].items():
        frac = f"{r['busbw_over_link']:.3f}" if r["busbw_over_link"] else ""
        print(f"{m:>22} {r['s_median']:9.4f} {r['s_min']:8.4f}..{r['s_max']:<8.4f} {r['busbw_MBps']:10.1f} {frac:>6}")
    print("ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in summ["ratios"].items()))
    sys.stdout.flush()


def arena(a, tmp, env, sizes, record):
    from harp_dev.cluster import net, topology as topo
    import linkrate
    st = topo.load(a.name) or net.up(a.name, a.ranks, rate=a.rate, mtu=a.mtu, delay=a.delay, jitter=a.jitter,
                                     loss=a.loss)
    try:
        record["cluster"] = {k: st.get(k) for k in ("hosts", "rate", "mtu", "congestion", "delay_ns", "jitter_ns",
                                                    "loss_ppm", "delay_line_ns", "rtt_asked_us", "rtt_measured_us")}
        env = dict(env, GLOO_SOCKET_IFNAME="eth0")
        record["link_MBps"] = [linkrate.measure(st, 1, 0) for _ in range(3)]
        link = statistics.median(record["link_MBps"])
        prefix = [sys.executable, "-m", "harp_dev.cluster", "run", "--name", a.name, "--hosts", str(a.ranks),
                  "--timeout", str(a.timeout), "--"]
        mpi = [sys.executable, "-m", "harp_dev.cluster", "run", "--name", a.name, "--hosts", str(a.ranks), "--launcher",
               "mpirun", "--timeout", str(a.timeout), "--"]
        reps = []
        for rep in range(a.repeat):
            rows = run_job(prefix, tmp, f"arena{rep}", a.iters, sizes, env, a.timeout + 60, a.modes)
            if a.mpi_modes:
                more = run_job(mpi, tmp, f"mpi{rep}", a.iters, sizes, env, a.timeout + 60, a.mpi_modes, MPI_WORKER)
                for r, m in zip(rows, more):
                    r["times_s"].update(m["times_s"])
            reps.append(rows)
            record["stamp_rep" + str(rep)] = stamp()
        record["arena"] = {"runs": reps, "summary": summarise(reps, a.ranks, link)}
        rtt = f", RTT asked {st['rtt_asked_us']:.0f} us" if st.get("rtt_asked_us") else ""
        print_table(f"64 tensors 4K-2M (32 MB) float32, {a.ranks} hosts x 1 rank, {a.rate}{rtt}, link {link:.1f} MB/s",
                    record["arena"]["summary"])
    finally:
        net.down(st)


def local(a, tmp, env, sizes, record):
    launch = [os.path.join(os.path.dirname(sys.executable), "harp-run")]
    if not os.path.exists(launch[0]):
        launch = [sys.executable, "-m", "harp.launch"]
    env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 2000))  # --with torch
    reps = []
    for rep in range(a.repeat):
        reps.append(run_job(launch + ["-n", str(a.ranks)], tmp, f"local{rep}", a.iters, sizes, env, a.timeout,
                            a.modes))
        record["stamp_rep" + str(rep)] = stamp()
    record["local"] = {"runs": reps, "summary": summarise(reps, a.ranks, None)}
    print_table(f"64 tensors 4K-2M (32 MB) float32, {a.ranks} local ranks, loopback {env['HARP_TRANSPORT']}",
                record["local"]["summary"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--where", choices=["local", "arena"], default="local")
    ap.add_argument("--name", default="coal17")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--delay", help="arena: one-way delay between hosts (harp-cluster --delay), e.g. 500us")
    ap.add_argument("--jitter")
    ap.add_argument("--loss")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--only", help="HARP's own modes to run, /-separated (default all of " + "/".join(MODES) + ")")
    ap.add_argument("--with", dest="families", default="",
                    help="further families, comma-separated: nccl (groupStart/End), torch (all_reduce_coalesced, "
                         "harp and gloo backends), mpi (Iallreduce+Waitall; arena only)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    fams = [f for f in a.families.split(",") if f]
    for f in fams:
        if f not in FAMILIES:
            ap.error(f"--with: unknown family '{f}' (known: {', '.join(FAMILIES)})")
    if "mpi" in fams and a.where != "arena":
        ap.error("--with mpi runs under the arena's mpirun: use --where arena")
    a.modes = (a.only.split("/") if a.only else list(MODES)) + [m for f in fams if f != "mpi" for m in FAMILIES[f]]
    a.mpi_modes = FAMILIES["mpi"] if "mpi" in fams else []
    tmp = tempfile.mkdtemp(prefix="coalesced-bench-")
    env = dict(os.environ, PYTHONPATH=PYDIR, OMP_NUM_THREADS="1", HARP_TRANSPORT=a.transport)
    sizes = tensor_sizes()
    record = {"stamp_before": stamp(), "command": " ".join(sys.argv), "modes": a.modes + a.mpi_modes,
              "tensor_bytes": sizes,
              "total_bytes": sum(sizes)}
    (arena if a.where == "arena" else local)(a, tmp, env, sizes, record)
    write_record(a.out, record)


if __name__ == "__main__":
    main()
