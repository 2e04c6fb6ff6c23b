"""bench/vpc/tcp_counters.py — one allreduce algorithm at a time on the arena, with every host's
TCP and tbf counters read around each run: is a slow point losing packets?

    python3 bench/vpc/tcp_counters.py --hosts 8 [--delay 500us] [--sizes 262144,1048576,16777216] \\
        [--repeat 2] recursive_doubling halving_doubling

Per algorithm, size and repetition it prints the time of the out-of-place and the in-place loop
(harp-bench's worker: 8 timed calls after 2 below 16 MB, 2 after 1 from there) and, summed over
the hosts' namespaces: TCP segments sent, retransmitted, lost retransmits and timeouts (nstat),
and packets the tbf qdiscs dropped and held (tc -s). Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import arena_bench  # noqa: E402  (puts python/ on the path)
from harp_dev.cluster import net, topology as topo  # noqa: E402

NSTAT = ("TcpOutSegs", "TcpRetransSegs", "TcpExtTCPLostRetransmit", "TcpExtTCPTimeouts")


def _ns(ns, *cmd):
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=30).stdout


def counters(name, hosts):
    """{counter: total over the hosts}: nstat's absolute TCP counters and the tbf qdiscs' drops
    and overlimits in each host's namespace, and the switch's drops."""
    tot = dict.fromkeys((*NSTAT, "tbf_dropped", "tbf_overlimits", "switch_dropped"), 0)
    for i in range(hosts):
        ns = topo.host_ns(name, i)
        for m in re.finditer(r"^(\w+)\s+(\d+)", _ns(ns, "nstat", "-az", *NSTAT), re.M):
            tot[m.group(1)] += int(m.group(2))
        q = _ns(ns, "tc", "-s", "qdisc")
        tot["tbf_dropped"] += sum(int(x) for x in re.findall(r"dropped (\d+)", q))
        tot["tbf_overlimits"] += sum(int(x) for x in re.findall(r"overlimits (\d+)", q))
    q = _ns(topo.switch_ns(name), "tc", "-s", "qdisc")
    tot["switch_dropped"] += sum(int(x) for x in re.findall(r"dropped (\d+)", q))
    return tot


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("algos", nargs="+", help="allreduce algorithms (HARP_ALGO names)")
    ap.add_argument("--name", default="tcpcnt")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--delay", help="one-way delay (harp-cluster --delay), e.g. 500us")
    ap.add_argument("--sizes", default="262144,1048576,16777216")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    st = net.up(a.name, a.hosts, delay=a.delay)
    try:
        tmp = tempfile.mkdtemp()
        print("algorithm bytes repetition oop_us ip_us " + " ".join((*NSTAT, "tbf_dropped", "tbf_overlimits",
                                                                     "switch_dropped")))
        for rep in range(a.repeat):
            for algo in a.algos:
                for size in sizes:
                    it, wu = (8, 2) if size < 16 << 20 else (2, 1)
                    wa = arena_bench.worker_args(os.path.join(tmp, f"{algo}-{size}-{rep}.json"), size, size, 2, it, wu)
                    wa["algo"] = algo
                    before = counters(a.name, a.hosts)
                    row = arena_bench.run_lib(a.name, "harp", a.hosts, wa, a.timeout)["rows"][0]
                    after = counters(a.name, a.hosts)
                    print(algo, size, rep, round(row.get("oop_us") or 0), round(row.get("ip_us") or 0),
                          " ".join(str(after[k] - before[k]) for k in after), flush=True)
    finally:
        net.down(st)


if __name__ == "__main__":
    main()
