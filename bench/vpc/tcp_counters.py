"""bench/vpc/tcp_counters.py — one allreduce algorithm at a time on the arena, with every host's
TCP and tbf counters read around each run: is a slow point losing packets?

    python3 bench/vpc/tcp_counters.py --hosts 8 [--delay 500us] [--sizes 262144,1048576,16777216] \\
        [--repeat 2] [--ss] [--tbf-latency 20ms,3ms,1ms] [--out F.json] \\
        recursive_doubling halving_doubling recursive_doubling@HARP_TCP_CONGESTION=bbr

An algorithm may carry extra environment for its ranks (ALGO@VAR=V+VAR2=V2, as arena_bench's
libraries do), so variants run in the same arena one after another.

Per algorithm, size and repetition it prints the time of the out-of-place and the in-place loop
(harp-bench's worker: 8 timed calls after 2 below 16 MB, 2 after 1 from there) and, summed over
the hosts' namespaces: TCP segments sent, retransmitted, lost retransmits and timeouts (nstat),
and packets the tbf qdiscs dropped and held (tc -s). With --ss, host 0's established TCP
sockets are read with `ss -tni` every --ss-every seconds while a run goes, and the medians over
the samples of its busiest socket are printed: cwnd (segments), srtt (ms), bytes not yet sent
(notsent), send and receive queue, the receiver's advertised window space (rcv_space) and the
delivery rate the kernel estimates, and the fraction of the machine's cores busy since the last
sample (cpu_busy, /proc/stat). --tbf-latency runs everything again at each queue limit of the
cluster's tbfs (how much each keeps before it drops; the cluster is made with 20 ms). --out writes
the rows as stamped JSON. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import arena_bench  # noqa: E402  (puts python/ on the path)
import stamp  # noqa: E402
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


SS_FIELDS = ("cwnd", "rtt_ms", "notsent", "send_q", "recv_q", "rcv_space", "delivery_MBps", "cpu_busy")


def cpu_times():
    """(busy, total) jiffies of all cores from /proc/stat (busy: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def ss_sample(ns):
    """One `ss -tni` of namespace `ns`: per established TCP socket {field: value} (SS_FIELDS)."""
    out, socks = _ns(ns, "ss", "-tniH", "state", "established"), []
    lines = out.splitlines()
    for head, info in zip(lines[0::2], lines[1::2]):
        q = head.split()
        s = {"recv_q": int(q[0]), "send_q": int(q[1])}
        for key, pat in (("cwnd", r"\bcwnd:(\d+)"), ("rtt_ms", r"\brtt:([\d.]+)"), ("notsent", r"\bnotsent:(\d+)"),
                         ("rcv_space", r"\brcv_space:(\d+)")):
            m = re.search(pat, info)
            s[key] = float(m.group(1)) if m else 0.0
        m = re.search(r"\bdelivery_rate (\d+(?:\.\d+)?)([KMG]?)bps", info)
        s["delivery_MBps"] = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)] / 8e6 if m else 0.0
        socks.append(s)
    return socks


class Sampler(threading.Thread):
    """`ss -tni` in host 0's namespace every `every` seconds until stop(); summary() gives the
    medians over the samples of the socket with the most bytes queued to send at each sample."""

    def __init__(self, ns, every):
        super().__init__(daemon=True)
        self.ns, self.every, self.rows, self.halt = ns, every, [], threading.Event()

    def run(self):
        last = cpu_times()
        while not self.halt.wait(self.every):
            socks = ss_sample(self.ns)
            now = cpu_times()
            busy = (now[0] - last[0]) / max(1, now[1] - last[1])  # the machine's cores since the last sample
            last = now
            if socks:
                self.rows.append(dict(max(socks, key=lambda s: s["send_q"] + s["notsent"]), cpu_busy=busy))

    def stop(self):
        self.halt.set()
        self.join()

    def summary(self):
        """{field: median} over the samples with bytes queued (all samples if none had), and
        "samples": (those, all)."""
        busy = [r for r in self.rows if r["send_q"] or r["recv_q"]] or self.rows
        out = {k: statistics.median(r[k] for r in busy) for k in SS_FIELDS} if busy else {}
        return dict(out, samples=[len(busy), len(self.rows)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("algos", nargs="+", help="allreduce algorithms (HARP_ALGO names)")
    ap.add_argument("--name", default="tcpcnt")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--delay", help="one-way delay (harp-cluster --delay), e.g. 500us")
    ap.add_argument("--sizes", default="262144,1048576,16777216")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--tbf-latency", default="",
                    help="comma list: run everything at each of these tbf queue limits (e.g. 20ms,3ms,1ms; the "
                         "cluster's own is 20ms); empty: leave the tbfs as made")
    ap.add_argument("--out", help="also write the rows here as JSON, stamped (commit, CPU, cores, load, time)")
    ap.add_argument("--ss", action="store_true", help="sample host 0's TCP sockets with ss -tni during each run")
    ap.add_argument("--ss-every", type=float, default=0.02, help="seconds between ss samples")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    if a.tbf_latency and a.delay:
        ap.error("--tbf-latency: with --delay the tbfs are the delay line's; not supported")
    lats = [x for x in a.tbf_latency.split(",") if x] or [None]
    record = {"stamp_before": stamp.stamp(), "command": " ".join(sys.argv), "rows": []}
    st = net.up(a.name, a.hosts, delay=a.delay)
    try:
        tmp = tempfile.mkdtemp()
        print("tbf_latency algorithm bytes repetition oop_us ip_us " + " ".join((*NSTAT, "tbf_dropped",
                                                                                 "tbf_overlimits", "switch_dropped")))
        for rep, lat, algo, size in ((r, t, al, sz) for r in range(a.repeat) for t in lats for al in a.algos
                                     for sz in sizes):
            if lat:
                net.set_tbf_latency(st, lat)
            it, wu = (8, 2) if size < 16 << 20 else (2, 1)
            name, _, extra = algo.partition("@")
            wa = arena_bench.worker_args(os.path.join(tmp, f"{len(extra)}-{name}-{size}-{rep}.json"), size, size, 2,
                                         it, wu)
            wa["algo"] = name
            before = counters(a.name, a.hosts)
            sampler = Sampler(topo.host_ns(a.name, 0), a.ss_every) if a.ss else None
            if sampler:
                sampler.start()
            try:
                row = arena_bench.run_lib(a.name, "harp" + ("@" + extra if extra else ""), a.hosts, wa,
                                          a.timeout)["rows"][0]
            finally:
                if sampler:
                    sampler.stop()
            after = counters(a.name, a.hosts)
            out = {"tbf_latency": lat or "20ms", "algorithm": algo, "bytes": size, "repetition": rep,
                   "oop_us": row.get("oop_us"), "ip_us": row.get("ip_us"), **{k: after[k] - before[k] for k in after}}
            print(out["tbf_latency"], algo, size, rep, round(row.get("oop_us") or 0), round(row.get("ip_us") or 0),
                  " ".join(str(after[k] - before[k]) for k in after), flush=True)
            if sampler:
                out["ss"] = sampler.summary()
                print("    ss", " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in out["ss"].items()), flush=True)
            record["rows"].append(out)
    finally:
        net.down(st)
    if a.out:
        stamp.write_record(a.out, record)


if __name__ == "__main__":
    main()
