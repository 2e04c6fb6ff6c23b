"""Build and tear down an arena cluster: namespaces, veth links, bridges, shaping, holders.

    st = net.up("arena", hosts=4, rate="1gbit")     # returns the saved state dict
    net.down(st)                                      # idempotent, never raises on leftovers

Topology: one switch namespace hc-<name>-br holding bridge br<j> per NIC j;
host i's namespace hc-<name>-h<i> has eth<j> (10.231.x.(i+1)/24), a veth whose
peer h<i>n<j> sits on br<j>. Each host's uplink is shaped in both directions by
shaping egress on both veth ends (tbf; htb when a per-pair cap is asked),
since this kernel has no ifb. `up` saves the state file before it creates
anything, so an interrupted `up` (Ctrl-C, error, kill) is undone by `down`.
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


def _tbf(dev, rate, ns):
    burst = max(256 * 1024, int(parse_rate(rate) * 0.002))
    sh("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", "20ms", ns=ns)


def _pair_capped(dev, st, me, nic, ns):
    """htb on a host's uplink: total `rate`, traffic to each other host capped at `flow_cap`."""
    rate, cap = st["rate"], st["flow_cap"]
    sh("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "2", ns=ns)
    sh("tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, ns=ns)
    sh("tc", "class", "add", "dev", dev, "parent", "1:1", "classid", "1:2", "htb", "rate", rate, ns=ns)
    for p in range(st["hosts"]):
        if p == me:
            continue
        cid = f"1:{p + 10:x}"
        sh("tc", "class", "add", "dev", dev, "parent", "1:1", "classid", cid, "htb", "rate", cap, "ceil", cap, ns=ns)
        sh("tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
           "dst", topo.address(st["slot"], p, nic) + "/32", "flowid", cid, ns=ns)


def _link_host(st, i, nic):
    ns, sw = topo.host_ns(st["name"], i), topo.switch_ns(st["name"])
    dev, peer = f"eth{nic}", f"h{i}n{nic}"
    sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", sw)
    for d, n in ((dev, ns), (peer, sw)):
        sh("ip", "-n", n, "link", "set", d, "mtu", st["mtu"])
    sh("ip", "-n", sw, "link", "set", peer, "master", f"br{nic}")
    sh("ip", "-n", ns, "addr", "add", topo.address(st["slot"], i, nic) + "/24", "dev", dev)
    sh("ip", "-n", sw, "link", "set", peer, "up")
    sh("ip", "-n", ns, "link", "set", dev, "up")
    if st["flow_cap"]:
        _pair_capped(dev, st, i, nic, ns)
    else:
        _tbf(dev, st["rate"], ns)
    _tbf(peer, st["rate"], sw)


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
            sys.executable, "-m", "harp.cluster.holder", "--hostname", topo.hostname(st["name"], i),
            "--hosts", hosts_path]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    line = p.stdout.readline()
    if not line.startswith("READY "):
        p.kill()
        raise RuntimeError(f"harp-cluster: holder of host {i} did not start: {p.stderr.read().strip()}")
    p.stdout.close()
    p.stderr.close()
    return int(line.split()[1])


def up(name, hosts, rate="1gbit", mtu=1500, nics=1, flow_cap=None, congestion=None):
    """Create cluster `name`; on any failure (or Ctrl-C) undo what was made, then re-raise."""
    topo.check_name(name)
    parse_rate(rate)
    if flow_cap:
        parse_rate(flow_cap)
    if not 1 <= hosts <= 250 or nics not in (1, 2) or not 576 <= mtu <= 9000:
        raise ValueError("harp-cluster up: --hosts 1..250, --nics 1|2, --mtu 576..9000")
    with topo.locked():
        if topo.load(name):
            raise RuntimeError(f"harp-cluster: cluster '{name}' is already up (harp-cluster down --name {name})")
        st = {"name": name, "slot": topo.free_slot(), "hosts": hosts, "rate": rate, "mtu": mtu, "nics": nics,
              "flow_cap": flow_cap, "congestion": congestion, "holders": [], "state": "building",
              "created": time.time(), "owner_pid": None}
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
    for j in range(st["nics"]):
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
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
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
    for suffix in (".hosts", ".mpi-agent"):
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
