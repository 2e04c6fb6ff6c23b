"""Names, addresses and the state file of an arena cluster.

A cluster has a name (default "arena") and a slot k in 0..31 chosen at `up`
so that several clusters (a user's and the tests') never share names or
addresses: host i's NIC j has address 10.231.(192 + 32 j + k).(i + 1)/24
(tests/netns.py uses 10.231.100-199). Namespaces are hc-<name>-h<i> (hosts)
and hc-<name>-br (the switch). The state file /run/harp-cluster/<name>.json
is written by `up` and removed by `down`; every field needed to tear the
cluster down is in it, so `down` works from any process, after any crash.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re

from harp import _params

STATE_DIR = _params.get("HARP_CLUSTER_STATE_DIR")
SLOTS = 32
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")


def check_name(name):
    if not _NAME_RE.match(name or ""):
        raise ValueError(f"cluster name {name!r}: use 1-8 lowercase letters/digits, starting with a letter")
    return name


def state_path(name):
    return os.path.join(STATE_DIR, f"{check_name(name)}.json")


def host_ns(name, i):
    return f"hc-{name}-h{i}"


def switch_ns(name):
    return f"hc-{name}-br"


def hostname(name, i):
    return f"{name}-node{i}"


def address(slot, host, nic=0):
    return f"10.231.{192 + 32 * nic + slot}.{host + 1}"


def subnet(slot, nic=0):
    return f"10.231.{192 + 32 * nic + slot}.0/24"


@contextlib.contextmanager
def locked():
    """Serialise up/down of all clusters on this machine (slot choice, state files)."""
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def all_states():
    """Every cluster's state (dicts), by name."""
    out = {}
    if not os.path.isdir(STATE_DIR):
        return out
    for fn in sorted(os.listdir(STATE_DIR)):
        if fn.endswith(".json"):
            try:
                with open(os.path.join(STATE_DIR, fn)) as f:
                    st = json.load(f)
                out[st["name"]] = st
            except (OSError, ValueError, KeyError):
                continue
    return out


def free_slot():
    used = {st.get("slot") for st in all_states().values()}
    # A slot is also busy if a namespace of another prefix holds its subnet; we only know our own.
    for k in range(SLOTS):
        if k not in used:
            return k
    raise RuntimeError(f"all {SLOTS} arena slots are in use: run `harp-cluster down --all`")


def load(name):
    try:
        with open(state_path(name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(st):
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    tmp = state_path(st["name"]) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(st, f, indent=1)
    os.replace(tmp, state_path(st["name"]))


def remove(name):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state_path(name))
