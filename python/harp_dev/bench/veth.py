"""harp-bench --veth: HARP over DPDK on a veth vs HARP's TCP on the same veth (vs gloo).

    sudo harp-bench allreduce --veth [--pmd af_xdp] [--mtu 1500] [--rounds 2] [--compare gloo]
    (was bench/dpdk_veth.py)

N network namespaces (-np, default 2), one rank each, joined by a data veth
pair through a bridge; the bootstrap store runs on a separate control veth
(harp_dev.cluster.veth_hosts; needs root and a build with the dpdk
transport). The same data veth carries:
  * harp-dpdk: HARP_TRANSPORT=dpdk, HARP_DPDK_PORT=<pmd>:<data veth> (kernel bypass)
  * harp-tcp:  HARP_TRANSPORT=tcp, HARP_SOCKET_IFNAME=<data veth>     (kernel TCP)
  * gloo (with --compare gloo), GLOO_SOCKET_IFNAME=<data veth>
each through harp-bench's worker sweep, `--rounds` interleaved rounds, best
time per size kept (a shared machine: no library gets all the quiet moments).
Every rank checks every result, out-of-place and in-place, with numpy; wrong
values of any round are summed. Then the DPDK transport's packet rate from
harp_dpdk_selftest --bench. Everything is removed afterwards.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

from . import check
from ..cluster import veth_hosts


def _run_all(hosts, argv, env, timeout=900):
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


def _keep_best(best, res):
    """Best time per size and form over rounds; wrong values of every round add up."""
    if best is None:
        return res
    for b, r in zip(best["rows"], res["rows"]):
        for mode in ("oop", "ip"):
            t = r.get(f"{mode}_us")
            if t is not None and (b.get(f"{mode}_us") is None or t < b[f"{mode}_us"]):
                b[f"{mode}_us"] = t
            if r.get(f"{mode}_wrong") is not None:
                b[f"{mode}_wrong"] = (b.get(f"{mode}_wrong") or 0) + r[f"{mode}_wrong"]
            if r.get(f"{mode}_note"):
                b[f"{mode}_note"] = r[f"{mode}_note"]
    return best


def run(a, tmp, worker_args):
    """{"harp-dpdk", "harp-tcp"[, "gloo"]: merged results}, [failures], packet-rate lines."""
    why = veth_hosts.dpdk_unavailable()
    if why:
        raise SystemExit(f"harp-bench --veth: the dpdk transport is unavailable: {why}")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HARP_", "MASTER_", "RANK", "WORLD_SIZE"))}
    base["PYTHONPATH"] = os.pathsep.join(sys.path)
    n = a.nranks
    results, failed = {}, []
    secret = os.urandom(16).hex()  # this run's job secret, the same on every rank
    with veth_hosts.dpdk_hosts(n, data_mtu=a.mtu) as hosts:
        k = hosts[0].addr.split(".")[2]
        for i, h in enumerate(hosts):  # IPs on the data veths for TCP and gloo
            subprocess.run(h.cmd(["ip", "addr", "add", f"10.234.{k}.{i + 1}/24", "dev", h.data]), check=True)

        def harp_env(kind):
            def env(r, h):
                e = dict(base, HARP_RANK=str(r), HARP_WORLD_SIZE=str(n), HARP_ADDR=f"{hosts[0].addr}:29611",
                         HARP_SECRET=f"{secret}-{kind}", HARP_TRANSPORT=kind,
                         HARP_TIMEOUT="120")
                if kind == "dpdk":
                    e.update(HARP_DPDK_PORT=f"{a.pmd}:{h.data}", HARP_DPDK_HUGE=os.environ.get("HARP_DPDK_HUGE", "0"))
                else:
                    e.update(HARP_SOCKET_IFNAME=h.data)
                return e
            return env

        def gloo_env(r, h):
            return dict(base, MASTER_ADDR=f"10.234.{k}.1", MASTER_PORT="29612", RANK=str(r), WORLD_SIZE=str(n),
                        LOCAL_RANK="0", GLOO_SOCKET_IFNAME=h.data)

        runs = [("harp-dpdk", "harp", harp_env("dpdk")), ("harp-tcp", "harp", harp_env("tcp"))]
        if "gloo" in a.compare:
            runs.append(("gloo", "gloo", gloo_env))
        for rnd in range(max(1, a.rounds)):
            for name, lib, env in runs:
                out = os.path.join(tmp, f"{name}-{rnd}.json")
                argv = [sys.executable, "-m", "harp_dev.bench.workers", lib, json.dumps(worker_args(a, out))]
                outs, rcs = _run_all(hosts, lambda r, h: argv, env)
                if any(rcs):
                    failed.append(f"{name}: round {rnd + 1}: ranks failed {rcs}: " + outs[0][-500:])
                    continue
                try:
                    res = check.merge(out, name, n)
                except RuntimeError as e:
                    failed.append(str(e))
                    continue
                results[name] = _keep_best(results.get(name), res)
        pps = packet_rate(a, hosts, base)
    return results, failed, pps


def packet_rate(a, hosts, base):
    """harp_dpdk_selftest --bench SIZE between ranks 0 and 1: the transport's own rate and latency."""
    import harp

    exe = os.path.join(os.path.dirname(harp.__file__), "harp_dpdk_selftest")
    if not os.path.exists(exe) or len(hosts) < 2:
        return ["(harp_dpdk_selftest not built: no packet rate)"]
    lines = []
    for size in (64, 8192, 1 << 20):
        d = tempfile.mkdtemp(prefix="harp-pps-")

        def env(r, h):
            return dict(base, HARP_DPDK_PORT=f"{a.pmd}:{h.data}", HARP_DPDK_HUGE=os.environ.get("HARP_DPDK_HUGE", "0"))
        outs, _ = _run_all(hosts[:2], lambda r, h: [exe, "--rank", str(r), "--size", "2", "--dir", d, "--bench",
                                                    str(size)], env, timeout=300)
        got = [re.search(r"OK bench .*", o) for o in outs]
        lines.append(f"{size} B: `{got[0].group(0) if got[0] else 'failed: ' + outs[0][-300:]}` / "
                     f"`{got[1].group(0) if got[1] else ''}`")
    return lines
