"""harp.verbs — the RDMA devices and ports this machine offers to HARP's verbs transport.

    >>> import harp.verbs
    >>> harp.verbs.devices()
    [{'name': 'rxe0', 'node_guid': '...', 'ports': [{'port': 1, 'state': 'ACTIVE', 'link_layer': 'Ethernet',
      'active_mtu': 1024, 'lid': 0, 'gids': [{'index': 1, 'gid': '::ffff:10.99.0.1', 'type': 'RoCE v2'}, ...]}]}]

Reads the devices through pyverbs (rdma-core's Python bindings). Debian ships them
as `python3-pyverbs` in /usr/lib/python3/dist-packages; the PyPI wheels do not load
the Soft-RoCE (rxe) provider, so when `pyverbs` is not importable as is, that one
directory is appended to sys.path for the import (only when its build matches this
interpreter). No device, or no pyverbs: harp.UnavailableError saying which.

The transport itself uses libibverbs directly; `HARP_IB_HCA` / `HARP_IB_GID_INDEX`
pick among what this function lists (see transport/verbs/README.md).
"""
from __future__ import annotations

import glob
import importlib
import os
import sys

from .errors import UnavailableError

_DEBIAN_DIST = "/usr/lib/python3/dist-packages"

_PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_LINK_LAYERS = {0: "unspecified", 1: "InfiniBand", 2: "Ethernet"}
_MTUS = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
_GID_TYPES = {0: "IB", 1: "RoCE v1", 2: "RoCE v2"}


def _import_pyverbs():
    try:
        return importlib.import_module("pyverbs.device")
    except ImportError:
        pass
    tag = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
    pkg = os.path.join(_DEBIAN_DIST, "pyverbs")
    if not os.path.isdir(pkg):
        raise UnavailableError("pyverbs is not installed (Debian/Ubuntu: apt-get install python3-pyverbs; "
                               "the PyPI wheels do not load the rxe provider)")
    if not glob.glob(os.path.join(pkg, f"device.{tag}*.so")):
        raise UnavailableError(f"{pkg} was built for another Python than this {tag} interpreter; "
                               "run with the system python3 or a matching version")
    # Make only pyverbs reachable: append (never prepend) the system directory,
    # import, and take the directory back out of sys.path.
    added = _DEBIAN_DIST not in sys.path
    if added:
        sys.path.append(_DEBIAN_DIST)
    try:
        return importlib.import_module("pyverbs.device")
    except ImportError as e:
        raise UnavailableError(f"cannot import pyverbs from {_DEBIAN_DIST}: {e}") from e
    finally:
        if added and _DEBIAN_DIST in sys.path:
            sys.path.remove(_DEBIAN_DIST)


def _s(v):
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def devices() -> list[dict]:
    """Every RDMA device with its ports (state, link layer, MTU, LID, GID table).

    Raises harp.UnavailableError when pyverbs is missing or no device exists.
    """
    d = _import_pyverbs()
    err_cls = getattr(importlib.import_module("pyverbs.pyverbs_error"), "PyverbsError", Exception)
    try:
        devs = d.get_device_list()
    except err_cls as e:
        raise UnavailableError(f"no RDMA device: libibverbs cannot list devices ({e}); is the ib_uverbs "
                               "module loaded and /dev/infiniband present?") from e
    if not devs:
        raise UnavailableError("no RDMA device found (load the NIC's driver, or create a Soft-RoCE device: "
                               "rdma link add rxe0 type rxe netdev <interface>)")
    out = []
    for dev in devs:
        name = _s(dev.name)
        entry = {"name": name, "ports": []}
        ctx = d.Context(name=name)
        try:
            attr = ctx.query_device()
            entry["max_qp"] = int(attr.max_qp)
            entry["max_mr_size"] = int(attr.max_mr_size)
            for port in range(1, attr.phys_port_cnt + 1):
                pa = ctx.query_port(port)
                gids = []
                for i in range(pa.gid_tbl_len):
                    try:
                        ge = ctx.query_gid_ex(port, i)  # GidEntry: gid + ibv_gid_type
                        g = ge.gid_str() if callable(ge.gid_str) else ge.gid_str
                        gid, gtype = _s(g), _GID_TYPES.get(int(ge.gid_type), str(ge.gid_type))
                    except (err_cls, AttributeError):
                        try:
                            gid, gtype = _s(ctx.query_gid(port, i)), "unknown"
                        except err_cls:
                            continue  # empty entry
                    if gid.replace("0", "").replace(":", "") == "":
                        continue
                    gids.append({"index": i, "gid": gid, "type": gtype})
                entry["ports"].append({
                    "port": port,
                    "state": _PORT_STATES.get(int(pa.state), str(pa.state)),
                    "link_layer": _LINK_LAYERS.get(int(pa.link_layer), str(pa.link_layer)),
                    "active_mtu": _MTUS.get(int(pa.active_mtu), int(pa.active_mtu)),
                    "lid": int(pa.lid),
                    "max_msg_sz": int(pa.max_msg_sz),
                    "gids": gids,
                })
        finally:
            ctx.close()
        out.append(entry)
    return out


def main(argv=None) -> int:
    """`python -m harp.verbs`: print the devices, one port per line."""
    try:
        devs = devices()
    except UnavailableError as e:
        print(f"harp.verbs: {e}", file=sys.stderr)
        return 1
    for dev in devs:
        for p in dev["ports"]:
            gids = ", ".join(f"[{g['index']}] {g['gid']} ({g['type']})" for g in p["gids"])
            print(f"{dev['name']}:{p['port']} {p['state']} {p['link_layer']} mtu {p['active_mtu']} gids {gids}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
