"""harp.torch — HARP as a torch.distributed backend.

    import torch.distributed as dist
    dist.init_process_group("harp")                  # or "cpu:harp,cuda:nccl", "cpu:harp,cuda:harp"

No import is needed when harp is installed: its `torch.backends` entry point
(harp_torch_plugin:load) registers the backend when torch is imported.
`import harp.torch` registers it too (needed when harp is used from a source
tree without installing, e.g. PYTHONPATH=python).

Rendezvous uses the Store torch creates for init_method (env://, tcp://,
file://); the timeout is init_process_group(timeout=...). Mixed specs give
harp the devices it is named for and build the other devices' backends
(nccl, gloo...) inside the harp process group, which routes each call by
the tensors' device. HARP errors surface as torch.distributed.DistBackendError
naming the operation, the rank and the group.
"""
from __future__ import annotations

import sys

import torch.distributed as dist

from ._pg import ProcessGroupHarp

__all__ = ["ProcessGroupHarp", "register", "BACKEND_NAME"]

BACKEND_NAME = "harp"


def _backend_map_of_caller():
    """{device: backend} of the init_process_group/new_group call being served, when torch exposes it."""
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            break
        cfg = f.f_locals.get("backend_config")
        if cfg is not None and hasattr(cfg, "get_device_backend_map"):
            return dict(cfg.get_device_backend_map()), f.f_locals
        f = f.f_back
    return None, None


def _other_backends(store, rank, size, timeout, group_name, ranks):
    """c10d backends for the devices a mixed spec gives to someone else ("cuda:nccl")."""
    dmap, _ = _backend_map_of_caller()
    others = {}
    if not dmap:
        return others
    for device, name in dmap.items():
        if name == BACKEND_NAME:
            continue
        pstore = dist.PrefixStore(f"harp-other/{device}/", store)
        if name == "gloo":
            b = dist.ProcessGroupGloo(pstore, rank, size, timeout=timeout)
        elif name == "nccl":
            if not dist.is_nccl_available():
                raise RuntimeError(f"backend spec gives {device} to nccl, but this torch has no NCCL")
            o = dist.ProcessGroupNCCL.Options()
            o._timeout = timeout  # private-ok: torch's own ProcessGroupNCCL.Options field
            o.global_ranks_in_group = ranks
            o.group_name = group_name
            b = dist.ProcessGroupNCCL(pstore, rank, size, o)
        else:
            plugin = dist.Backend._plugins.get(name.upper())
            if plugin is None:
                raise RuntimeError(f"backend spec gives {device} to unknown backend '{name}'")
            if plugin.extended_api:
                opts = dist.distributed_c10d._DistributedBackendOptions()
                opts.store, opts.group_rank, opts.group_size, opts.timeout = pstore, rank, size, timeout
                opts.group_id, opts.global_ranks_in_group = group_name, ranks
                b = plugin.creator_fn(opts, None)
            else:
                b = plugin.creator_fn(pstore, rank, size, timeout)
        others[device] = b
    return others


def _create(dist_opts, backend_options=None):
    """torch's extended-API creator: (c10d::DistributedBackendOptions, backend options) -> process group."""
    store, rank, size = dist_opts.store, dist_opts.group_rank, dist_opts.group_size
    timeout, name = dist_opts.timeout, str(dist_opts.group_id)
    ranks = list(dist_opts.global_ranks_in_group)
    others = _other_backends(store, rank, size, timeout, name, ranks)
    return ProcessGroupHarp(store, rank, size, timeout=timeout, group_name=name, other_backends=others,
                            members=ranks)


def register():
    """Register "harp" with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


register()
