"""Build and tear down an arena cluster: namespaces, veth links, bridges, shaping, holders.

    st = net.up("arena", hosts=4, rate="1gbit")     # returns the saved state dict
    net.down(st)                                      # idempotent, never raises on leftovers

Topology: one switch namespace hc-<name>-br holding bridge br<j> per NIC j;
host i's namespace hc-<name>-h<i> has eth<j> (10.231.x.(i+1)/24), a veth whose
peer h<i>n<j> sits on br<j>. Each host's uplink is shaped in both directions by
shaping egress on both veth ends (tbf; on the host side htb with per-TCP-flow
classes when --flow-cap is asked, see flow_cap_commands),
since this kernel has no ifb. `up` saves the state file before it creates
anything, so an interrupted `up` (Ctrl-C, error, kill) is undone by `down`.

Round-trip time, jitter, loss, slow hosts and zones (--delay, --jitter, --loss, --host-delay,
--zones/--zone-delay): this kernel has no netem, so the switch is then not a bridge but
harp-delayline (delayline.c), a user-space switch in the switch namespace that holds each frame
until its due time; tbf still shapes the rate on the veths. --delay is the one-way delay
between two hosts (ping shows twice it). The path through the delay line costs some tens of
microseconds by itself: `up` measures the RTT between hosts 0 and 1 (probe.py), takes half the
excess off the line's delay, and records asked and delivered RTT in the state
(harp-cluster status shows them). Where the kernel has netem, it is not used either: one
mechanism, measured, everywhere.
Blocking: every command here has a timeout (CMD_TIMEOUT seconds).
"""
from __future__ import annotations

import os
import shutil
import re
import signal
import subprocess
import sys
import time

from . import topology as topo

CMD_TIMEOUT = 30
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")
_TIME_RE = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|ms|s)$")
_LOSS_RE = re.compile(r"^(\d+(?:\.\d+)?)%$")
PROBE_PORT = 5299


def parse_time(v, what="--delay"):
    """'100us', '1ms', '0.5ms' -> nanoseconds (0 .. 10 s)."""
    m = _TIME_RE.match(str(v).strip().lower())
    if not m:
        raise ValueError(f"{what} {v!r}: write a time with its unit, e.g. 100us, 1ms, 0.5ms")
    ns = float(m.group(1)) * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[m.group(2)]
    if ns > 10e9:
        raise ValueError(f"{what} {v!r}: at most 10s")
    return int(round(ns))


def parse_loss(v):
    """'0.1%' -> parts per million."""
    m = _LOSS_RE.match(str(v).strip())
    if not m or float(m.group(1)) > 100:
        raise ValueError(f"--loss {v!r}: a percentage of frames, e.g. 0.1%")
    return int(round(float(m.group(1)) * 1e4))


def parse_host_map(specs, hosts, parse, what):
    """['2=500mbit', '3=1ms'] (or 'a=b,c=d') -> {host index: parse(value)}."""
    out = {}
    for spec in specs or []:
        for item in str(spec).split(","):
            if not item:
                continue
            k, sep, v = item.partition("=")
            if not sep or not k.strip().isdigit() or not 0 <= int(k) < hosts:
                raise ValueError(f"{what} {item!r}: HOST=VALUE with HOST in 0..{hosts - 1}")
            parse(v)  # refuse a bad value now
            out[int(k)] = v.strip()
    return out


def parse_rate(rate):
    """'1gbit' -> bytes per second (tc's decimal units)."""
    m = _RATE_RE.match(rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 100mbit, 1gbit, 10gbit")
    mult = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    bits = float(m.group(1)) * mult
    if not 1e6 <= bits <= 400e9:
        raise ValueError(f"rate {rate!r}: must be between 1mbit and 400gbit")
    return bits / 8


def sh(*cmd, ns=None, check=True):
    """Run a command (inside network namespace ns if given); raise with its stderr on failure."""
    argv = (["ip", "netns", "exec", ns] if ns else []) + [str(c) for c in cmd]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT)
    if check and r.returncode:
        raise RuntimeError(f"harp-cluster: `{' '.join(argv)}` failed: {r.stderr.strip()}")
    return r


TBF_LATENCY = "20ms"  # how much queue a link's tbf keeps (rate x latency + burst) before it drops


def _tbf(dev, rate, ns, latency=TBF_LATENCY, op="add"):
    burst = max(256 * 1024, int(parse_rate(rate) * 0.002))
    sh("tc", "qdisc", op, "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", latency, ns=ns)


def set_tbf_latency(st, latency):
    """Every tbf of cluster `st` (each host's NICs and the switch's ports toward them) at `latency`
    of queue instead of TBF_LATENCY, at the rate it has (benchmarks: does the queue's depth matter?).
    Not on a --flow-cap cluster, whose hosts' side is an htb tree."""
    if st.get("flow_cap"):
        raise RuntimeError("harp-cluster: set_tbf_latency needs tbf on both ends; this cluster has --flow-cap")
    parse_time(latency, "latency")
    sw = topo.switch_ns(st["name"])
    for i in range(st["hosts"]):
        rate = host_rate(st, i)
        for nic in range(st["nics"]):
            _tbf(f"eth{nic}", rate, topo.host_ns(st["name"], i), latency, op="change")
            _tbf(f"h{i}n{nic}", rate, sw, latency, op="change")


FLOW_BUCKETS = 16  # classes of the per-flow cap; see _flow_capped
# u32 filter priorities of the per-flow cap (lower runs first). Never 0: to tc, prio 0 means "any"
# (a `filter del ... prio 0` deletes every filter, the hash tree included).
THROTTLE_PRIO, HASH_PRIO = 1, 2


def _tc_batch(lines, ns):
    """Run tc commands (one per line, without the leading 'tc') in one process."""
    r = subprocess.run(["ip", "netns", "exec", ns, "tc", "-batch", "-"], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=CMD_TIMEOUT)
    if r.returncode:
        raise RuntimeError(f"harp-cluster: tc -batch in {ns} failed: {r.stderr.strip()}")


def flow_cap_commands(dev, rate, cap):
    """tc lines for a per-TCP-flow cap on `dev`: htb root at the link `rate` (class 1:1);
    non-TCP and IP-option traffic goes to 1:2 (link rate); each TCP packet is put into one of
    FLOW_BUCKETS classes 1:10..1:1f, each capped at `cap`, by two u32 hash levels: the low 4 bits
    of the source port pick a table, the low 4 bits of the destination port a bucket in it, and
    bucket (s, d) feeds class s XOR d. This kernel has htb and u32 but no fq/sfq-per-flow rate.
    The hash filters sit at prio HASH_PRIO; throttle_flow's one-flow filter at THROTTLE_PRIO, before them.

    Collisions: two flows whose (sport ^ dport) & 15 are equal share one cap (u32 hashes only
    masked bits, no full 4-tuple hash). The lanes of one HARP pair share one port (the
    listener's) and Linux gives consecutive connects to one destination ports 2 apart, so up
    to 8 lanes of a pair land in 8 different classes; flows of different host pairs leaving one
    host may collide (each then gets cap/2)."""
    out = [f"qdisc add dev {dev} root handle 1: htb default 2",
           f"class add dev {dev} parent 1: classid 1:1 htb rate {rate}",
           f"class add dev {dev} parent 1:1 classid 1:2 htb rate {rate}"]
    for c in range(FLOW_BUCKETS):
        out.append(f"class add dev {dev} parent 1:1 classid 1:{0x10 + c:x} htb rate {cap} ceil {cap}")
    out.append(f"filter add dev {dev} parent 1: prio {HASH_PRIO} handle 100: protocol ip u32 divisor 16")
    for sp in range(16):
        out.append(f"filter add dev {dev} parent 1: prio {HASH_PRIO} handle {0x200 + sp:x}: protocol ip u32 divisor 16")
    # TCP without IP options (ports at byte 20): hash on the source port's low nibble
    out.append(f"filter add dev {dev} parent 1: prio {HASH_PRIO} protocol ip u32 ht 800:: match ip protocol 6 0xff "
               f"match u8 0x05 0x0f at 0 hashkey mask 0x000f0000 at 20 link 100:")
    for sp in range(16):
        out.append(f"filter add dev {dev} parent 1: prio {HASH_PRIO} protocol ip u32 ht 100:{sp:x}: match u32 0 0 "
                   f"hashkey mask 0x0000000f at 20 link {0x200 + sp:x}:")
        for dp in range(16):
            out.append(f"filter add dev {dev} parent 1: prio {HASH_PRIO} protocol ip u32 ht {0x200 + sp:x}:{dp:x}: "
                       f"match u32 0 0 flowid 1:{0x10 + ((sp ^ dp) % FLOW_BUCKETS):x}")
    return out


def _flow_capped(dev, st, ns):
    _tc_batch(flow_cap_commands(dev, st["rate"], st["flow_cap"]), ns)


def throttle_flow(st, host, sport, dport, rate, nic=0):
    """Cap the one TCP flow host:sport -> dport leaving `host` at `rate` (benchmarks: one slow lane).
    Needs a cluster up with a flow cap (the htb tree); the flow gets its own class 1:3 under the
    link class, matched before the hash buckets. Idempotent per cluster: one throttled flow."""
    if not st.get("flow_cap"):
        raise RuntimeError("harp-cluster throttle: the cluster has no --flow-cap (no htb tree to add to)")
    parse_rate(rate)
    ns, dev = topo.host_ns(st["name"], host), f"eth{nic}"
    prio = str(THROTTLE_PRIO)
    sh("tc", "filter", "del", "dev", dev, "parent", "1:", "prio", prio, ns=ns, check=False)
    sh("tc", "class", "del", "dev", dev, "classid", "1:3", ns=ns, check=False)
    sh("tc", "class", "add", "dev", dev, "parent", "1:1", "classid", "1:3", "htb", "rate", rate, "ceil", rate, ns=ns)
    sh("tc", "filter", "add", "dev", dev, "parent", "1:", "prio", prio, "protocol", "ip", "u32",
       "match", "ip", "protocol", "6", "0xff", "match", "ip", "sport", int(sport), "0xffff",
       "match", "ip", "dport", int(dport), "0xffff", "flowid", "1:3", ns=ns)


def _link_host(st, i, nic):
    ns, sw = topo.host_ns(st["name"], i), topo.switch_ns(st["name"])
    dev, peer = f"eth{nic}", f"h{i}n{nic}"
    sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", sw)
    for d, n in ((dev, ns), (peer, sw)):
        sh("ip", "-n", n, "link", "set", d, "mtu", st["mtu"])
    if not st.get("delay_line"):
        sh("ip", "-n", sw, "link", "set", peer, "master", f"br{nic}")
    # --loss keeps segmentation offload on: the delay line draws loss per wire segment of a GSO frame
    # (delayline.c), where turning offload off made the 2 shared cores forward ~80k frames/s and capped
    # a 4-host ring at 0.85 of the line without any loss (bench/RESULTS-vpc.md).
    sh("ip", "-n", ns, "addr", "add", topo.address(st["slot"], i, nic) + "/24", "dev", dev)
    sh("ip", "-n", sw, "link", "set", peer, "up")
    sh("ip", "-n", ns, "link", "set", dev, "up")
    rate = host_rate(st, i)
    if st["flow_cap"]:
        _flow_capped(dev, dict(st, rate=rate), ns)
    else:
        _tbf(dev, rate, ns)
    _tbf(peer, rate, sw)


def host_rate(st, i):
    """Host i's uplink rate: --host-rate i=R, else --rate."""
    return (st.get("host_rate") or {}).get(str(i), st["rate"])


def zone_of(st, i):
    """Hosts split into --zones consecutive groups (host i in zone i * zones // hosts)."""
    return i * st.get("zones", 1) // st["hosts"]


def expected_rtt_ns(st, a, b):
    """The round trip asked between hosts a and b: twice the one-way delay of the path."""
    if not st.get("delay_line"):
        return 0
    hd = st.get("host_delay") or {}
    one = st["delay_ns"] + parse_time(hd.get(str(a), "0ns")) + parse_time(hd.get(str(b), "0ns"))
    if zone_of(st, a) != zone_of(st, b):
        one += st.get("zone_delay_ns", 0)
    return 2 * one


def delayline_binary():
    """harp-delayline, compiled from delayline.c (beside this file) into the state folder (root's,
    0755) when the source is newer than the binary there."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "delayline.c")
    os.makedirs(topo.STATE_DIR, mode=0o755, exist_ok=True)
    out = os.path.join(topo.STATE_DIR, "harp-delayline")
    if not (os.access(out, os.X_OK) and os.path.getmtime(out) >= os.path.getmtime(src)):
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            raise RuntimeError(f"harp-cluster: --delay/--jitter/--loss need a C compiler (cc or gcc) to build "
                               f"harp-delayline from {src}")
        tmp = out + f".{os.getpid()}"
        r = subprocess.run([cc, "-O2", "-o", tmp, src], capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise RuntimeError(f"harp-cluster: building harp-delayline failed: {r.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    return out


def _mac(ns, dev):
    out = sh("ip", "-n", ns, "-o", "link", "show", dev).stdout
    m = re.search(r"link/ether ([0-9a-f:]{17})", out)
    if not m:
        raise RuntimeError(f"harp-cluster: no MAC address on {dev} in {ns}")
    return m.group(1)


def start_delay_lines(st, delay_ns):
    """One harp-delayline per NIC in the switch namespace, with `delay_ns` as its base delay."""
    sw, exe, pids = topo.switch_ns(st["name"]), delayline_binary(), []
    hd = st.get("host_delay") or {}
    for j in range(st["nics"]):
        argv = ["ip", "netns", "exec", sw, exe, "--delay", str(delay_ns), "--jitter", str(st.get("jitter_ns", 0)),
                "--loss", str(st.get("loss_ppm", 0)), "--zone-delay", str(st.get("zone_delay_ns", 0)),
                "--seed", str(st["slot"] * 16 + j + 1),
                "--stats", os.path.join(topo.STATE_DIR, f"{st['name']}.delayline{j}.json")]
        for i in range(st["hosts"]):
            extra = parse_time(hd.get(str(i), "0ns"))
            argv += ["--port", f"h{i}n{j},{_mac(topo.host_ns(st['name'], i), f'eth{j}')},{zone_of(st, i)},{extra}"]
        p, _ = _start_ready(argv, f"harp-delayline for NIC {j}")
        pids.append(p.pid)
    st["delay_line_pids"] = pids
    st["delay_line_ns"] = delay_ns


def stop_delay_lines(st):
    # Only recorded pids still inside the switch namespace: a pid that has gone may have been reused.
    inside = set(ns_pids(topo.switch_ns(st["name"])))
    _terminate([p for p in st.get("delay_line_pids") or [] if p in inside])
    st["delay_line_pids"] = []


def probe(st, a=0, b=1, stream=0.0, udp=0, rounds=300, nic=0):
    """What the link between hosts a and b delivers (probe.py): {'rtt_us': {...}, ...}."""
    import json
    srv_ns, cli_ns = topo.host_ns(st["name"], b), topo.host_ns(st["name"], a)
    addr = topo.address(st["slot"], b, nic)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    srv = subprocess.Popen(["ip", "netns", "exec", srv_ns, sys.executable, "-m", "harp_dev.cluster.probe", "server", addr,
                            str(PROBE_PORT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if not srv.stdout.readline().startswith("READY"):
            raise RuntimeError(f"harp-cluster probe: server did not start: {srv.stderr.read().strip()}")
        r = subprocess.run(["ip", "netns", "exec", cli_ns, sys.executable, "-m", "harp_dev.cluster.probe", "client", addr,
                            str(PROBE_PORT), "--rounds", str(rounds), "--stream", str(stream), "--udp", str(udp)],
                           capture_output=True, text=True, env=env, timeout=CMD_TIMEOUT + stream + udp / 5000)
        if r.returncode:
            raise RuntimeError(f"harp-cluster probe failed: {r.stderr.strip()[-2000:]}")
        subprocess.run(["ip", "netns", "exec", cli_ns, sys.executable, "-m", "harp_dev.cluster.probe", "stop", addr,
                        str(PROBE_PORT)], capture_output=True, env=env, timeout=CMD_TIMEOUT)
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        try:
            srv.wait(timeout=5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def calibrate_delay_lines(st, passes=3, within=0.05):
    """Take the delay line's own cost off its delay: measure the RTT between hosts 0 and 1 and
    start the lines again with half the error taken off (or added to) the one-way delay, kept
    in [0, asked]; up to `passes` times, until the median is within `within` of the asked RTT."""
    if st["hosts"] < 2 or not st.get("delay_ns"):
        return
    want = expected_rtt_ns(st, 0, 1)
    line = st["delay_ns"]

    def measure():  # the median of three probes' medians: one probe can land on a bad schedule
        runs = sorted((probe(st, rounds=200)["rtt_us"] for _ in range(3)), key=lambda r: r["median"])
        return runs[1]

    got = measure()
    for _ in range(passes):
        err = got["median"] * 1e3 - want
        if abs(err) <= within * want:
            break
        line = int(min(st["delay_ns"], max(0, line - err / 2)))
        stop_delay_lines(st)
        start_delay_lines(st, line)
        got = measure()
    st["rtt_asked_us"] = want / 1e3
    st["rtt_measured_us"] = got


def hosts_file(st):
    lines = ["127.0.0.1 localhost"]
    for i in range(st["hosts"]):
        lines.append(f"{topo.address(st['slot'], i)} {topo.hostname(st['name'], i)}")
    path = os.path.join(topo.STATE_DIR, f"{st['name']}.hosts")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def start_holder(st, i, hosts_path):
    ns = topo.host_ns(st["name"], i)
    argv = ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private",
            sys.executable, "-m", "harp_dev.cluster.holder", "--hostname", topo.hostname(st["name"], i),
            "--hosts", hosts_path]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    _, line = _start_ready(argv, f"holder of host {i}", env=env)
    return int(line.split()[1])


def _start_ready(argv, what, env=None):
    """Start a daemon in its own session and wait for its "READY ..." line; (process, line).
    A daemon that exits or prints anything else is killed and its stderr raised."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    line = p.stdout.readline()
    if not line.startswith("READY"):
        p.kill()
        raise RuntimeError(f"harp-cluster: {what} did not start: {p.stderr.read().strip()}")
    p.stdout.close()
    p.stderr.close()
    return p, line


def up(name, hosts, rate="1gbit", mtu=1500, nics=1, flow_cap=None, congestion=None, delay=None, jitter=None,
       loss=None, host_delay=None, host_rate=None, zones=1, zone_delay=None):
    """Create cluster `name`; on any failure (or Ctrl-C) undo what was made, then re-raise.
    delay/jitter/zone_delay: times ('100us'); loss: '0.1%'; host_delay/host_rate: ['2=1ms', ...]."""
    topo.check_name(name)
    parse_rate(rate)
    if flow_cap:
        parse_rate(flow_cap)
    if not 1 <= hosts <= 250 or nics not in (1, 2) or not 576 <= mtu <= 9000:
        raise ValueError("harp-cluster up: --hosts 1..250, --nics 1|2, --mtu 576..9000")
    if not 1 <= zones <= hosts:
        raise ValueError(f"harp-cluster up: --zones {zones}: between 1 and --hosts ({hosts})")
    if hosts > 64 and (delay or jitter or loss or host_delay or zone_delay):
        raise ValueError("harp-cluster up: the delay line switches at most 64 hosts")
    hd = parse_host_map(host_delay, hosts, lambda v: parse_time(v, "--host-delay"), "--host-delay")
    hr = parse_host_map(host_rate, hosts, parse_rate, "--host-rate")
    net = {"delay_ns": parse_time(delay) if delay else 0, "jitter_ns": parse_time(jitter, "--jitter") if jitter else 0,
           "loss_ppm": parse_loss(loss) if loss else 0, "zones": zones,
           "zone_delay_ns": parse_time(zone_delay, "--zone-delay") if zone_delay else 0,
           "host_delay": {str(k): v for k, v in hd.items()}, "host_rate": {str(k): v for k, v in hr.items()}}
    net["delay_line"] = bool(net["delay_ns"] or net["jitter_ns"] or net["loss_ppm"] or hd or net["zone_delay_ns"])
    with topo.locked():
        if topo.load(name):
            raise RuntimeError(f"harp-cluster: cluster '{name}' is already up (harp-cluster down --name {name})")
        st = {"name": name, "slot": topo.free_slot(), "hosts": hosts, "rate": rate, "mtu": mtu, "nics": nics,
              "flow_cap": flow_cap, "congestion": congestion, "holders": [], "state": "building",
              "created": time.time(), "owner_pid": None, **net}
        topo.save(st)
    try:
        _build(st)
    except BaseException:
        down(st)
        raise
    st["state"] = "up"
    topo.save(st)
    return st


def _build(st):
    name, sw = st["name"], topo.switch_ns(st["name"])
    sh("ip", "netns", "add", sw)
    for j in range(st["nics"] if not st.get("delay_line") else 0):
        sh("ip", "-n", sw, "link", "add", f"br{j}", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", f"br{j}", "mtu", st["mtu"], "up")
    for i in range(st["hosts"]):
        ns = topo.host_ns(name, i)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        for j in range(st["nics"]):
            _link_host(st, i, j)
        if st["congestion"]:
            sh("sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={st['congestion']}", ns=ns)
    if st.get("delay_line"):
        start_delay_lines(st, st["delay_ns"])
        topo.save(st)
        calibrate_delay_lines(st)
        topo.save(st)
    path = hosts_file(st)
    for i in range(st["hosts"]):
        st["holders"].append(start_holder(st, i, path))
        topo.save(st)


def ns_pids(ns):
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def _signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_host_processes(st, grace=2.0):
    """SIGTERM then SIGKILL every process inside the cluster's namespaces (ranks, daemons, holders)."""
    names = [topo.host_ns(st["name"], i) for i in range(st["hosts"])] + [topo.switch_ns(st["name"])]
    # Only processes found inside the namespaces: a recorded holder pid that is no longer
    # there may have been reused by an unrelated process.
    pids = {p for n in names for p in ns_pids(n)}
    pids.discard(os.getpid())
    _terminate(pids, grace)


def _terminate(pids, grace=2.0):
    """SIGTERM, up to `grace` seconds for them to exit, then SIGKILL to those left."""
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.02)
    _signal_all([p for p in pids if _alive(p)], signal.SIGKILL)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def down(st):
    """Remove everything of cluster st; idempotent. Returns a list of what could not be removed."""
    kill_host_processes(st)
    problems = []
    for ns in [topo.host_ns(st["name"], i) for i in range(st["hosts"])] + [topo.switch_ns(st["name"])]:
        if os.path.exists(f"/run/netns/{ns}"):
            r = sh("ip", "netns", "del", ns, check=False)
            if r.returncode:
                problems.append(f"{ns}: {r.stderr.strip()}")
    for suffix in (".hosts", ".mpi-agent") + tuple(f".delayline{j}.json" for j in range(st.get("nics", 1))):
        try:
            os.unlink(os.path.join(topo.STATE_DIR, st["name"] + suffix))
        except FileNotFoundError:
            pass
    for f in os.listdir(topo.STATE_DIR) if os.path.isdir(topo.STATE_DIR) else []:
        if f.startswith(st["name"] + ".slurm-"):  # a Slurm job folder a killed run left (cluster/slurm.py)
            shutil.rmtree(os.path.join(topo.STATE_DIR, f), ignore_errors=True)
    with topo.locked():
        topo.remove(st["name"])
    return problems
