"""TCP lanes under a per-flow cap: 64 MB allreduce busbw across arena hosts.

    python3 bench/vpc/lanes_bench.py --hosts 4 --rate 1gbit --flow-cap 250mbit --repeat 2 \
        --out results/arena/lanes.json

Brings up (or reuses) arena cluster --name (default lanes) with --hosts hosts,
1 rank per host, every TCP flow capped at --flow-cap (harp-cluster --flow-cap:
u32 hash of the ports into htb classes). Measures the link payload rate with 4
parallel flows and one flow (tests/flowrate.py), then, in one run and per
repetition, float32 allreduce of --bytes (default 64 MB, --iters timed calls
after one warm-up) for:

  harp-1, harp-auto, harp-4, harp-8   HARP_SOCKET_NSTREAMS=1|auto|4|8
  gloo                                torch.distributed gloo (one flow per pair)
  harp-4-thr                          4 lanes, one lane of host 0 -> host 1
                                      throttled to flow-cap/4 (harp-cluster
                                      throttle) while the job runs
  old-4, old-4-thr                    the library before TCP lanes (--old-python
                                      DIR: its built python/ folder) with
                                      HARP_NSOCKS_PERPEER=4, without and with the
                                      throttled lane (skipped without --old-python)

busbw = 2(n-1)/n x bytes / time; reported as median and min..max over
repetitions (each repetition's figure is the median of its --iters calls) and
as a fraction of the link rate. Every result is checked (each element = n).
Writes one JSON with a provenance stamp (commit, CPU, cores, load, time) taken
before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PYDIR = os.path.join(ROOT, "python")
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)
from harp_dev.cluster import net, topology as topo  # noqa: E402
from stamp import stamp  # noqa: E402

CONFIGS = {
    "harp-1": {"HARP_SOCKET_NSTREAMS": "1"},
    "harp-auto": {"HARP_SOCKET_NSTREAMS": "auto"},
    "harp-4": {"HARP_SOCKET_NSTREAMS": "4"},
    "harp-8": {"HARP_SOCKET_NSTREAMS": "8"},
    "gloo": None,
    "harp-4-thr": {"HARP_SOCKET_NSTREAMS": "4"},
    # the library before lanes (--old-python: its python/ folder, built): equal fixed-size
    # pieces round-robin, each socket with its own queue
    "old-4": {"HARP_NSOCKS_PERPEER": "4"},
    "old-4-thr": {"HARP_NSOCKS_PERPEER": "4"},
}


# ---------------------------------------------------------------------------- worker (one rank)
def worker(lib, nbytes, iters, sync):
    import numpy as np

    n = nbytes // 4
    x = np.ones(n, np.float32)
    out = np.empty_like(x)
    if lib == "gloo":
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        t = torch.from_numpy(out)

        def call():
            out[:] = 1.0
            dist.all_reduce(t)

        barrier = dist.barrier
    else:
        import harp

        comm = harp.init(timeout=600)
        rank, size = comm.rank, comm.size

        def call():
            comm.allreduce(x, out)

        barrier = comm.barrier
    call()  # warm-up (and connections)
    if sync:
        barrier()
        if rank == 0:
            open(os.path.join(sync, "ready"), "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(sync, "go")) and time.monotonic() < deadline:
                time.sleep(0.05)
        barrier()
    times = []
    for _ in range(iters):
        barrier()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if not (out[0] == size and out[-1] == size and out[n // 2] == size):
            raise SystemExit(f"rank {rank}: wrong allreduce result {out[0]} {out[-1]} (want {size})")
    if rank == 0:
        print("TIMES " + json.dumps(times), flush=True)


# ---------------------------------------------------------------------------- driver
def lane_ports(st, host, peer, lanes):
    """(sport, dport) of the lanes from `host` to `peer`: the connections sharing one local port."""
    ns = topo.host_ns(st["name"], host)
    mine, theirs = topo.address(st["slot"], host), topo.address(st["slot"], peer)
    r = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tnH", "state", "established"], capture_output=True,
                       text=True, timeout=30)
    groups = {}
    for line in r.stdout.splitlines():
        f = line.split()
        loc, rem = f[-2], f[-1]
        if loc.rsplit(":", 1)[0] == mine and rem.rsplit(":", 1)[0] == theirs:
            groups.setdefault(int(loc.rsplit(":", 1)[1]), []).append(int(rem.rsplit(":", 1)[1]))
    for lport, rports in groups.items():
        if len(rports) == lanes:
            return [(lport, p) for p in sorted(rports)]
    raise RuntimeError(f"no group of {lanes} lanes from host {host} to host {peer}: {r.stdout}")


def class_bytes(st, host, classid):
    out = subprocess.run(["tc", "-n", topo.host_ns(st["name"], host), "-s", "class", "show", "dev", "eth0"],
                         capture_output=True, text=True, timeout=30).stdout
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"class htb {classid} "):
            return int(lines[i + 1].split()[1])
    return 0


def run_config(st, a, cfg, tmp):
    env = dict(os.environ, PYTHONPATH=a.old_python if cfg.startswith("old-") else PYDIR, GLOO_SOCKET_IFNAME="eth0",
               OMP_NUM_THREADS="1", HARP_TRANSPORT="tcp")
    env.update(CONFIGS[cfg] or {})
    if cfg == "harp-auto":
        env["HARP_DEBUG"] = "INFO"  # the probe's rates and choice, per pair
    lib = "gloo" if cfg == "gloo" else "harp"
    sync = ""
    if "-thr" in cfg:
        sync = tempfile.mkdtemp(dir=tmp)
    cmd = [sys.executable, "-m", "harp_dev.cluster", "run", "--name", a.name, "--hosts", str(a.hosts), "--timeout",
           str(a.timeout), "--", sys.executable, os.path.abspath(__file__), "--worker", lib, str(a.bytes),
           str(a.iters), sync]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    throttled = None
    if sync:
        deadline = time.monotonic() + a.timeout
        while not os.path.exists(os.path.join(sync, "ready")) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        lanes = lane_ports(st, 0, 1, 4)
        throttled = lanes[0]
        net.throttle_flow(st, 0, throttled[0], throttled[1], a.thr_rate)
        before = class_bytes(st, 0, "1:3")
        open(os.path.join(sync, "go"), "w").close()
    out, err = p.communicate(timeout=a.timeout + 120)
    if p.returncode:
        raise RuntimeError(f"{cfg} failed ({p.returncode}): {err[-3000:]}")
    times = json.loads(next(l for l in out.splitlines() if l.startswith("TIMES "))[6:])
    rec = {"times_s": times}
    if cfg == "harp-auto":
        rec["auto_kept"] = [int(m) for m in re.findall(r"lane probe .*-> keep (\d+) lane", out + err)]
        rec["auto_probe"] = [l.split("INFO ", 1)[-1] for l in (out + err).splitlines() if "-> keep" in l]
    if throttled:
        rec["throttled_flow"] = throttled
        rec["throttled_class_bytes"] = class_bytes(st, 0, "1:3") - before
    return rec


def flows_rate(st, n):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_flowcap  # noqa: E402  (tests/flowrate.py runner)

    return sum(test_flowcap._flows(st, n, seconds=3.0)) / 8 / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=4, metavar=("LIB", "BYTES", "ITERS", "SYNC"))
    ap.add_argument("--name", default="lanes")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--flow-cap", default="250mbit")
    ap.add_argument("--thr-rate", default=None, help="rate of the throttled lane (default flow-cap / 4)")
    ap.add_argument("--bytes", type=int, default=64 << 20)
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--old-python", help="python/ folder of a built HARP from before TCP lanes (old-* configs)")
    ap.add_argument("--out", required=False)
    a = ap.parse_args()
    if a.worker:
        lib, nbytes, iters, sync = a.worker
        return worker(lib, int(nbytes), int(iters), sync)
    a.thr_rate = a.thr_rate or f"{net.parse_rate(a.flow_cap) * 8 / 4 / 1e6:g}mbit"
    st = topo.load(a.name)
    made = st is None
    if made:
        st = net.up(a.name, a.hosts, rate=a.rate, flow_cap=a.flow_cap)
    tmp = tempfile.mkdtemp(prefix="lanes-bench-")
    try:
        record = {"stamp_before": stamp(), "command": " ".join(sys.argv),
                  "cluster": {k: st[k] for k in ("hosts", "rate", "mtu", "flow_cap")},
                  "link_4flows_MBps": flows_rate(st, 4), "one_flow_MBps": flows_rate(st, 1), "runs": {}}
        link = record["link_4flows_MBps"]
        print(f"# link payload rate (4 flows): {link:.1f} MB/s; one flow: {record['one_flow_MBps']:.1f} MB/s",
              flush=True)
        configs = [c for c in a.configs.split(",") if a.old_python or not c.startswith("old-")]
        for rep in range(a.repeat):
            for cfg in configs:
                try:
                    rec = run_config(st, a, cfg, tmp)
                except RuntimeError as e:  # one retry: torch's gloo has aborted at start-up here
                    print(f"# rep {rep} {cfg}: failed, retrying once: {str(e)[-300:]}", flush=True)
                    record.setdefault("failures", []).append({"rep": rep, "config": cfg, "error": str(e)[-2000:]})
                    rec = run_config(st, a, cfg, tmp)
                record["runs"].setdefault(cfg, []).append(rec)
                med = statistics.median(rec["times_s"])
                bw = 2 * (a.hosts - 1) / a.hosts * a.bytes / med / 1e6
                print(f"# rep {rep} {cfg}: median {med:.3f} s busbw {bw:.1f} MB/s ({bw / link:.3f} x link)"
                      + (f" throttled {rec['throttled_flow']} carried {rec['throttled_class_bytes']} B"
                         if "throttled_flow" in rec else "")
                      + (f" auto kept {rec['auto_kept']}" if "auto_kept" in rec else ""), flush=True)
        record["summary"] = summary(record, a, link)
        record["stamp_after"] = stamp()
        if a.out:
            with open(a.out, "w") as f:
                json.dump(record, f, indent=1)
    finally:
        if made:
            net.down(st)


def summary(record, a, link):
    print(f"## {a.bytes >> 20} MB float32 allreduce, {a.hosts} hosts x 1 rank, {a.rate} links, flow cap "
          f"{a.flow_cap}; link {link:.1f} MB/s (4 flows)")
    print(f"{'config':>18} {'busbw MB/s':>11} {'min..max':>15} {'/link':>6}")
    out = {}
    for cfg, runs in record["runs"].items():
        bws = [2 * (a.hosts - 1) / a.hosts * a.bytes / statistics.median(r["times_s"]) / 1e6 for r in runs]
        med = statistics.median(bws)
        out[cfg] = {"busbw_MBps": med, "min": min(bws), "max": max(bws), "over_link": med / link}
        print(f"{cfg:>18} {med:11.1f} {min(bws):7.1f}..{max(bws):<7.1f} {med / link:6.3f}")
    for thr, base in (("harp-4-thr", "harp-4"), ("old-4-thr", "old-4")):
        if thr in out and base in out:
            out[thr]["over_unthrottled"] = out[thr]["busbw_MBps"] / out[base]["busbw_MBps"]
            print(f"{thr} / {base} = {out[thr]['over_unthrottled']:.3f}")
    return out


if __name__ == "__main__":
    main()
