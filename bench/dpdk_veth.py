"""Benchmark: HARP over DPDK (af_xdp on a veth) vs HARP's TCP over the same veth vs gloo.

    sudo python bench/dpdk_veth.py [--collective allreduce] [-b 8] [-e 16M] [--pmd af_xdp]

Two network namespaces, one rank each, joined by a data veth pair through a
bridge (see tests/dpdk_env.py; the bootstrap store runs on a separate control
veth). The same data veth carries:
  * HARP, HARP_TRANSPORT=dpdk, HARP_DPDK_PORT=<pmd>:<data veth>  (kernel bypass)
  * HARP, HARP_TRANSPORT=tcp, HARP_SOCKET_IFNAME=<data veth>     (kernel TCP)
  * gloo (torch.distributed), GLOO_SOCKET_IFNAME=<data veth>
each through harp-bench's own sweep code (nccl-tests columns), plus the DPDK
transport's packet rate from harp_dpdk_selftest --bench. Prints a markdown
report (paste into bench/RESULTS-dpdk.md). Everything is removed afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import dpdk_env  # noqa: E402
from harp.bench import sweep  # noqa: E402


def run_all(hosts, argv, env, timeout=900):
    procs = [h.popen(argv(r, h), env=env(r, h), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, h in enumerate(hosts)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(TIMEOUT)")
    return outs, [p.returncode for p in procs]


def parse_csv(out):
    rows = {}
    for line in out.splitlines():
        f = line.split(",")
        if len(f) == 12 and f[0] == "harp" and f[1].isdigit():
            def num(x):
                return float(x) if x not in ("None", "", "nan") else None
            rows[int(f[1])] = {"us": num(f[9]) or num(f[6]), "busbw": num(f[10]) or num(f[7]),
                               "wrong": int(float(f[11] if f[11] not in ("None", "") else 0))}
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--collective", default="allreduce")
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="16M")
    ap.add_argument("-f", default="4")
    ap.add_argument("-n", default="20")
    ap.add_argument("--pmd", default="af_xdp")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--repeat", type=int, default=2, help="interleaved rounds; best time per size is kept")
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HARP_", "MASTER_", "RANK", "WORLD_SIZE"))}
    base["PYTHONPATH"] = os.pathsep.join(sys.path)
    sweep_args = [a.collective, "-b", a.b, "-e", a.e, "-f", a.f, "-n", a.n, "-w", "5", "--csv", "--no-progress"]
    results = {}
    with dpdk_env.dpdk_hosts(2, data_mtu=a.mtu) as hosts:
        k = hosts[0].addr.split(".")[2]
        for i, h in enumerate(hosts):  # IPs on the data veths for TCP and gloo
            subprocess.run(h.cmd(["ip", "addr", "add", f"10.234.{k}.{i + 1}/24", "dev", h.data]), check=True)
        data_ip0 = f"10.234.{k}.1"

        def harp_env(kind):
            def env(r, h):
                e = dict(base, HARP_RANK=str(r), HARP_WORLD_SIZE="2", HARP_ADDR=f"{hosts[0].addr}:29611",
                         HARP_SECRET=f"bench-{kind}", HARP_TRANSPORT=kind, HARP_TIMEOUT="120")
                if kind == "dpdk":
                    e.update(HARP_DPDK_PORT=f"{a.pmd}:{h.data}", HARP_DPDK_HUGE=os.environ.get("HARP_DPDK_HUGE", "0"))
                else:
                    e.update(HARP_SOCKET_IFNAME=h.data)
                return e
            return env

        def keep_best(name, rows):
            # Several interleaved rounds, best per size: the machine is shared, and
            # interleaving keeps one library from getting all the quiet moments.
            best = results.setdefault(name, {})
            for size, r in rows.items():
                if size not in best or (r["us"] and best[size]["us"] and r["us"] < best[size]["us"]):
                    best[size] = dict(r, wrong=(r["wrong"] or 0) + (best.get(size, {}).get("wrong") or 0))

        for rep in range(a.repeat):
            for kind in ("dpdk", "tcp"):
                outs, rcs = run_all(hosts, lambda r, h: [sys.executable, "-m", "harp.bench.cli", *sweep_args],
                                    harp_env(kind))
                if any(rcs):
                    print(f"# harp {kind} failed: {rcs}\n" + "\n".join(outs), file=sys.stderr)
                    continue
                keep_best("harp-" + kind, parse_csv(outs[0]))
            run_gloo(a, hosts, base, data_ip0, keep_best)

        # Packet rate and latency of the transport itself.
        import harp
        exe = os.path.join(os.path.dirname(harp.__file__), "harp_dpdk_selftest")
        pps = {}
        for size in (64, 8192, 1 << 20):
            d = tempfile.mkdtemp(prefix="harp-pps-")

            def senv(r, h):
                return dict(base, HARP_DPDK_PORT=f"{a.pmd}:{h.data}", HARP_DPDK_HUGE=os.environ.get("HARP_DPDK_HUGE", "0"))
            outs, rcs = run_all(hosts, lambda r, h: [exe, "--rank", str(r), "--size", "2", "--dir", d, "--bench",
                                                     str(size)], senv, timeout=300)
            m = re.search(r"OK bench .*", outs[0])
            m1 = re.search(r"OK bench .*", outs[1])
            pps[size] = (m.group(0) if m else "failed: " + outs[0][-300:], m1.group(0) if m1 else "")
    report(a, sweep_args, results, pps)


def run_gloo(a, hosts, base, data_ip0, keep_best):
    if True:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "gloo.json")
            wargs = {"coll": a.collective, "minbytes": sweep.parse_size(a.b), "maxbytes": sweep.parse_size(a.e),
                     "factor": float(a.f), "step": 0, "iters": int(a.n), "warmup": 5, "check": 1,
                     "dtype": "float32", "op": "sum", "root": 0, "algo": None, "transport": None, "out": out,
                     "progress": False}

            def genv(r, h):
                return dict(base, MASTER_ADDR=data_ip0, MASTER_PORT="29612", RANK=str(r), WORLD_SIZE="2",
                            LOCAL_RANK="0", GLOO_SOCKET_IFNAME=h.data)
            outs, rcs = run_all(hosts, lambda r, h: [sys.executable, "-m", "harp.bench.workers", "gloo",
                                                     json.dumps(wargs)], genv)
            if not any(rcs) and os.path.exists(out):
                g = json.load(open(out))
                rows = {}
                for r in g["rows"]:
                    key = "ip_us" if r.get("ip_us") else "oop_us"
                    rows[r["size"]] = {"us": r[key], "busbw": sweep.busbw(a.collective, r, 2, key),
                                       "wrong": (r.get("ip_wrong") or 0) + (r.get("oop_wrong") or 0)}
                keep_best("gloo", rows)
            else:
                print("# gloo failed:\n" + "\n".join(outs), file=sys.stderr)


def report(a, sweep_args, results, pps):
    cmd = " ".join(["python", "bench/dpdk_veth.py"] + sys.argv[1:])
    print(f"## {a.collective}, 2 ranks in 2 network namespaces, {a.pmd} on veth (MTU {a.mtu})\n")
    print(f"Command: `{cmd}` (harp-bench sweep: `harp-bench {' '.join(sweep_args)}` per rank; "
          f"{a.repeat} interleaved rounds dpdk/tcp/gloo, best time per size)\n")
    libs = [x for x in ("harp-dpdk", "harp-tcp", "gloo") if x in results]
    print("| size | " + " | ".join(f"{l} us | {l} busbw GB/s" for l in libs) + " | dpdk/tcp busbw | dpdk/gloo busbw |")
    print("|---:|" + "---:|---:|" * len(libs) + "---:|---:|")
    sizes = sorted(set().union(*[set(results[l]) for l in libs])) if libs else []
    for s in sizes:
        cells = []
        for l in libs:
            r = results[l].get(s)
            cells += [f"{r['us']:.1f}" if r and r["us"] else "-", f"{r['busbw']:.3f}" if r and r["busbw"] else "-"]
        def ratio(x, y):
            rx, ry = results.get(x, {}).get(s), results.get(y, {}).get(s)
            if rx and ry and rx["busbw"] and ry["busbw"]:
                return f"{rx['busbw'] / ry['busbw']:.2f}"
            if rx and ry and rx["us"] and ry["us"]:
                return f"{ry['us'] / rx['us']:.2f} (time)"
            return "-"
        print(f"| {s} | " + " | ".join(cells) + f" | {ratio('harp-dpdk', 'harp-tcp')} | {ratio('harp-dpdk', 'gloo')} |")
    wrong = {l: sum(r["wrong"] or 0 for r in results[l].values()) for l in libs}
    print(f"\nWrong values: {wrong}\n")
    print("Packet rate (harp_dpdk_selftest --bench SIZE; rank 0 sender line, rank 1 receiver line):\n")
    for size, (l0, l1) in pps.items():
        print(f"- {size} B: `{l0}` / `{l1}`")


if __name__ == "__main__":
    main()
