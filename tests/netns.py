"""Test hosts: network namespaces joined by veth pairs, made and removed by the tests.

    with netns_hosts(2) as hosts:          # hosts[i].name, hosts[i].addr
        hosts[0].run([...])                # a command inside host 0

Each host is a namespace `harp-t<pid>-<i>` with one veth end addressed
10.231.<k>.<i+1>/24 on a private bridge namespace, so any host reaches any other.
Traffic stays inside namespaces this test made. Needs root and iproute2;
`available()` says why not otherwise.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess


def available():
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2 (ip) is not installed"
    r = subprocess.run(["ip", "netns", "add", f"harp-probe-{os.getpid()}"], capture_output=True, text=True)
    if r.returncode:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"harp-probe-{os.getpid()}"], capture_output=True)
    return ""


def _ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")


class Host:
    def __init__(self, name, addr, ifname):
        self.name, self.addr, self.ifname = name, addr, ifname

    def cmd(self, argv):
        return ["ip", "netns", "exec", self.name] + list(argv)

    def popen(self, argv, **kw):
        return subprocess.Popen(self.cmd(argv), **kw)


@contextlib.contextmanager
def netns_hosts(n, subnet=None, netem=None):
    """n hosts on one bridge. netem: optional `tc netem` args applied on every host's veth."""
    tag = f"t{os.getpid() % 100000}"
    k = subnet if subnet is not None else 100 + os.getpid() % 100
    br = f"harp-{tag}-br"
    hosts, made = [], []
    try:
        subprocess.run(["ip", "netns", "add", br], check=True, capture_output=True)
        made.append(br)
        _ip("link", "add", "br0", "type", "bridge", ns=br)
        _ip("link", "set", "br0", "up", ns=br)
        for i in range(n):
            name = f"harp-{tag}-{i}"
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
            made.append(name)
            a, b = f"hv{tag}{i}a"[:15], f"hv{tag}{i}b"[:15]
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            _ip("link", "set", a, "netns", name)
            _ip("link", "set", b, "netns", br)
            _ip("link", "set", b, "master", "br0", ns=br)
            _ip("link", "set", b, "up", ns=br)
            addr = f"10.231.{k}.{i + 1}"
            _ip("addr", "add", f"{addr}/24", "dev", a, ns=name)
            _ip("link", "set", a, "up", ns=name)
            _ip("link", "set", "lo", "up", ns=name)
            if netem:
                subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", a, "root", "netem", *netem],
                               check=True, capture_output=True)
            hosts.append(Host(name, addr, a))
        yield hosts
    finally:
        for name in reversed(made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
