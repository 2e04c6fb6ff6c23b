"""harp-cluster: command line of the VPC arena (see harp_dev.cluster).

    harp-cluster up --hosts 4 [--rate 1gbit] [--mtu 1500] [--nics 1|2] [--flow-cap RATE] [--congestion bbr]
                    [--delay 100us] [--jitter 20us] [--loss 0.1%] [--host-rate 2=500mbit] [--host-delay 3=1ms]
                    [--zones 2 --zone-delay 1ms]
    harp-cluster probe [--from 0 --to 1] [--stream 2] [--udp 20000]   (RTT, rate, loss as delivered)
    harp-cluster run --hosts 4 --ppn 1 [--launcher harp|torchrun|mpirun|slurm] [--timeout S] -- CMD ...
    harp-cluster status [--json]
    harp-cluster down [--all]
    harp-cluster throttle --host H --sport P --dport Q --rate R   (one TCP flow; needs --flow-cap)

`run` uses the cluster `--name` (default "arena") when it is up; otherwise it
brings up an ephemeral one with the `up` options given and takes it down when
the job ends (also on Ctrl-C, errors, and SIGKILL through a detached reaper).

Mechanisms: rates are kernel tbf (or htb with --flow-cap) on both ends of each host's veth.
Round-trip time, jitter, loss and zones are harp-delayline, a user-space switch that holds each
frame until its due time (this machine's kernel has no netem): --delay is the one-way delay
between two hosts (ping shows twice it), --jitter draws each frame's delay in +-jitter without
reordering a pair's frames, --loss drops that share of wire packets (each segment of a TCP
GSO frame on its own draw; offloads stay on), --host-delay adds a host's own delay to each
frame to or from it, --zones splits the hosts into consecutive groups and --zone-delay adds to
frames between groups. `up` measures the RTT between hosts 0 and 1, corrects the line for its
own cost, and `status` shows asked and delivered RTT; `probe` measures any pair.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from harp import _params
from . import launchers
from . import net
from . import runner
from . import topology as topo


def _up_opts(ap, hosts_required):
    ap.add_argument("--hosts", type=int, required=hosts_required, help="number of emulated hosts")
    ap.add_argument("--rate", default="1gbit", help="each host's uplink rate, both directions (default 1gbit)")
    ap.add_argument("--mtu", type=int, default=1500, choices=[1500, 9000])
    ap.add_argument("--nics", type=int, default=1, choices=[1, 2], help="NICs (addresses, bridges) per host")
    ap.add_argument("--flow-cap", help="cap on each TCP flow leaving a host (clouds cap single flows): u32 "
                                       "hashing of the ports into 16 htb classes at this rate under the link "
                                       "rate; flows with equal (sport^dport)&15 share a class (net.py)")
    ap.add_argument("--congestion", choices=["bbr", "cubic", "reno"], help="TCP congestion control in every host")
    ap.add_argument("--delay", help="one-way delay between two hosts, e.g. 50us, 0.5ms (RTT: twice it); harp-delayline")
    ap.add_argument("--jitter", help="each frame's delay drawn in +-JITTER (no reordering within a host pair)")
    ap.add_argument("--loss", help="share of frames dropped, e.g. 0.1%%")
    ap.add_argument("--host-rate", action="append", metavar="H=RATE", help="host H's uplink rate (a slow host)")
    ap.add_argument("--host-delay", action="append", metavar="H=TIME", help="extra delay on frames to and from host H")
    ap.add_argument("--zones", type=int, default=1, help="split the hosts into this many consecutive zones")
    ap.add_argument("--zone-delay", help="extra one-way delay between hosts of different zones")


def parser():
    ap = argparse.ArgumentParser(prog="harp-cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    from harp._version import __version__

    ap.add_argument("--version", action="version", version=f"harp-cluster (harp {__version__})")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", default=_params.get("HARP_CLUSTER_NAME"),
                        help="cluster name (default arena, or $HARP_CLUSTER_NAME)")
    sub = ap.add_subparsers(dest="verb", required=True)
    _up_opts(sub.add_parser("up", parents=[common], help="create the emulated hosts"), True)
    r = sub.add_parser("run", parents=[common], help="run a command on the hosts through a real launcher")
    _up_opts(r, True)
    r.add_argument("--ppn", type=int, default=1, help="ranks per host (default 1)")
    r.add_argument("--launcher", default="harp", choices=launchers.LAUNCHERS)
    r.add_argument("--timeout", type=float, help="stop the job after this many seconds (exit status 124)")
    r.add_argument("--grace", type=float, default=5.0, help="seconds the other ranks get after one fails")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    s = sub.add_parser("status", parents=[common], help="hosts, rates, and the processes on each")
    s.add_argument("--json", action="store_true")
    d = sub.add_parser("down", parents=[common], help="remove the cluster (namespaces, links, qdiscs, processes)")
    d.add_argument("--all", action="store_true", help="every arena cluster on this machine")
    t = sub.add_parser("throttle", parents=[common], help="cap one TCP flow leaving a host (needs --flow-cap)")
    t.add_argument("--host", type=int, required=True)
    t.add_argument("--sport", type=int, required=True, help="the flow's source port (on --host)")
    t.add_argument("--dport", type=int, required=True)
    t.add_argument("--rate", required=True)
    pr = sub.add_parser("probe", parents=[common], help="measure RTT (TCP ping-pong), rate and loss between two hosts")
    pr.add_argument("--from", dest="src", type=int, default=0)
    pr.add_argument("--to", dest="dst", type=int, default=1)
    pr.add_argument("--stream", type=float, default=2.0, help="seconds of one TCP stream (0: none)")
    pr.add_argument("--udp", type=int, default=0, help="datagrams sent for a loss count (0: none)")
    rp = sub.add_parser("_reap", parents=[common])
    rp.add_argument("--pid", type=int, required=True)
    rp.add_argument("--job", required=True)
    rp.add_argument("--down")
    return ap


def _status(st):
    out = {k: st[k] for k in ("name", "hosts", "rate", "mtu", "nics", "flow_cap", "congestion", "state")}
    for k in ("delay_ns", "jitter_ns", "loss_ppm", "zones", "zone_delay_ns", "host_delay", "host_rate",
              "delay_line", "delay_line_ns", "rtt_asked_us", "rtt_measured_us"):
        if k in st:
            out[k] = st[k]
    out["hosts_detail"] = []
    for i in range(st["hosts"]):
        ns = topo.host_ns(st["name"], i)
        procs = []
        for pid in net.ns_pids(ns):
            if pid in st.get("holders", []):
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    procs.append({"pid": pid, "cmd": f.read().replace(b"\0", b" ").decode(errors="replace")[:120]})
            except OSError:
                pass
        out["hosts_detail"].append({"host": i, "netns": ns, "hostname": topo.hostname(st["name"], i),
                                    "addrs": [topo.address(st["slot"], i, j) for j in range(st["nics"])],
                                    "processes": procs})
    return out


def cmd_status(a):
    states = topo.all_states()
    rows = [_status(st) for st in states.values()]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no arena cluster is up")
    for c in rows:
        print(f"cluster {c['name']}: {c['hosts']} hosts, {c['rate']} uplinks, mtu {c['mtu']}, {c['nics']} nic(s)"
              f"{', flow cap ' + c['flow_cap'] if c['flow_cap'] else ''}"
              f"{', ' + c['congestion'] if c['congestion'] else ''} [{c['state']}]")
        if c.get("delay_line"):
            m = c.get("rtt_measured_us") or {}
            print(f"  delay line: one-way {c['delay_ns'] / 1e3:g} us (line set to {c.get('delay_line_ns', 0) / 1e3:g} us), "
                  f"jitter {c['jitter_ns'] / 1e3:g} us, loss {c['loss_ppm'] / 1e4:g}%, zones {c['zones']} "
                  f"(+{c['zone_delay_ns'] / 1e3:g} us); RTT 0<->1 asked {c.get('rtt_asked_us', 0):.0f} us, "
                  f"measured median {m.get('median', 0):.0f} us")
        for h in c["hosts_detail"]:
            print(f"  host {h['host']} {h['hostname']:<14} {' '.join(h['addrs']):<16} "
                  f"{len(h['processes'])} process(es)")
            for p in h["processes"]:
                print(f"      {p['pid']:>7} {p['cmd']}")
    return 0


def cmd_down(a):
    names = list(topo.all_states()) if a.all else [a.name]
    rc = 0
    for n in names:
        st = topo.load(n)
        if not st:
            print(f"harp-cluster: no cluster '{n}' is up", file=sys.stderr)
            continue
        for p in net.down(st):
            print(f"harp-cluster: could not remove {p}", file=sys.stderr)
            rc = 1
    return rc


def _up(a):
    return net.up(a.name, a.hosts, a.rate, a.mtu, a.nics, a.flow_cap, a.congestion, delay=a.delay, jitter=a.jitter,
                  loss=a.loss, host_delay=a.host_delay, host_rate=a.host_rate, zones=a.zones, zone_delay=a.zone_delay)


def cmd_run(a):
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        print("harp-cluster run: no command given (harp-cluster run --hosts 2 -- python x.py)", file=sys.stderr)
        return 2
    st = topo.load(a.name)
    ephemeral = st is None
    if ephemeral:
        st = _up(a)
        st["owner_pid"] = os.getpid()
        topo.save(st)
    try:
        return runner.run(st, a.launcher, a.hosts, a.ppn, cmd, timeout=a.timeout, grace=a.grace)
    finally:
        if ephemeral:
            net.down(st)


def main(argv=None):
    a = parser().parse_args(argv)
    _params.warn_unknown()  # misspelt HARP_* variables, once (base/params.def)
    if a.verb != "_reap":
        topo.check_name(a.name)
    if a.verb in ("up", "run", "down", "throttle", "probe") and os.geteuid() != 0:
        print("harp-cluster: needs root (network, UTS and mount namespaces)", file=sys.stderr)
        sys.exit(1)
    if a.verb in ("up", "run"):
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, runner._raise_interrupt)
    try:
        if a.verb == "up":
            st = _up(a)
            print(f"cluster {st['name']} up: {st['hosts']} hosts at {topo.subnet(st['slot'])}, {st['rate']} uplinks")
            rc = 0
        elif a.verb == "run":
            rc = cmd_run(a)
        elif a.verb == "status":
            rc = cmd_status(a)
        elif a.verb == "down":
            rc = cmd_down(a)
        elif a.verb == "probe":
            st = topo.load(a.name)
            if not st:
                raise RuntimeError(f"no cluster '{a.name}' is up")
            print(json.dumps(net.probe(st, a.src, a.dst, stream=a.stream, udp=a.udp)))
            rc = 0
        elif a.verb == "throttle":
            st = topo.load(a.name)
            if not st:
                raise RuntimeError(f"no cluster '{a.name}' is up")
            net.throttle_flow(st, a.host, a.sport, a.dport, a.rate)
            rc = 0
        else:
            runner.reap(a.pid, a.job, a.down)
            rc = 0
    except KeyboardInterrupt:
        rc = 130
    except (RuntimeError, ValueError) as e:
        print(f"harp-cluster: {e}", file=sys.stderr)
        rc = 1
    sys.exit(rc)
