"""Sparse (torch.sparse_coo) allreduce for the torch backend, as gloo offers it.

    dist.all_reduce(grad)            # grad.is_sparse: an embedding's sparse gradient
    work = dist.all_reduce(grad, async_op=True); work.wait(); work.result()  # [the reduced tensor]

Steps, on every rank of the group's collective communicator, in one issue order:
  1. allgather of a fixed header (nnz, sparse_dim, dense_dim, ndim, dtype id): every rank checks that
     all ranks agree on everything but nnz, and raises the same ValueError naming the first rank that
     differs (so nobody waits for data of a shape it cannot hold); after 2, every nnz must fit the
     shape (0 <= nnz <= the number of sparse positions) before it sizes a receive buffer;
  2. allgather of the shape (ndim int64), checked the same way;
  3. alltoallv of the coalesced indices (nnz x sparse_dim int64) and of the values' bytes, each rank
     sending its whole part to every rank (an allgather with per-rank counts);
  4. the concatenation in rank order is summed by coalesce(): every rank adds the same entries in
     the same order, so the result is identical on every rank and from run to run.
The result is written into the input (`tensor.copy_`, sparse to sparse) and is the work's result().

Ops: SUM and AVG (gloo: SUM only); AVG divides the values by the group size (truncating for
integers, as HARP's dense integer avg). Device tensors are reduced on the host and copied back.

Cost (P ranks, nnz_r entries on rank r, s = sparse_dim x 8 + bytes of one entry's values): every rank
receives sum_r nnz_r x s bytes: the allgather of every (index, value), linear in P. Where the union
of indices is a large part of the dense tensor, a dense allreduce of the dense form costs less
(2 x dense bytes); harp.compress's top-k uses the balanced sparse reduce-scatter for that case.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import torch

from ._tensors import UnsupportedError

_HEADER = 5  # nnz, sparse_dim, dense_dim, ndim, dtype id


def _dtype_id(dtype) -> int:
    return zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF


def _field(j, v):
    """A header value as the error names it (dtype ids back to torch's names where known)."""
    if j != 4:
        return str(int(v))
    names = {_dtype_id(d): str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
    return names.get(int(v), f"dtype id {int(v)}")


def _bad_nnz(nnz, sparse_shape):
    """The first rank whose entry count a coalesced tensor of that shape cannot have, or None."""
    most = math.prod(sparse_shape)
    return next((r for r, n in enumerate(nnz) if not 0 <= n <= most), None)


def _first_difference(rows, skip=()):
    """(rank, column) of the first rank whose row differs from rank 0's outside `skip`, or None."""
    for r in range(1, rows.shape[0]):
        for j in range(rows.shape[1]):
            if j not in skip and rows[r, j] != rows[0, j]:
                return r, j
    return None


def sparse_allreduce(comm, t: torch.Tensor, op_name: str, timeout=None) -> torch.Tensor:
    """Reduce the sparse COO tensor `t` over `comm` (a harp Communicator) into `t`; returns `t`."""
    if op_name not in ("SUM", "AVG"):
        raise UnsupportedError(f"harp allreduce: sparse tensors reduce with SUM or AVG only, not {op_name}")
    size = comm.size
    c = t.detach().to("cpu").coalesce()
    names = ("nnz", "sparse_dim", "dense_dim", "number of dimensions", "dtype")
    head = np.array([c._nnz(), c.sparse_dim(), c.dense_dim(), c.dim(), _dtype_id(c.dtype)], np.int64)
    heads = comm.allgather(head, timeout=timeout).reshape(size, _HEADER)
    diff = _first_difference(heads, skip=(0,))
    if diff is not None:
        r, j = diff
        raise ValueError(f"harp allreduce: sparse tensors differ across ranks: {names[j]} is {_field(j, heads[0, j])} "
                         f"on rank 0, {_field(j, heads[r, j])} on rank {r}")
    shape = np.array(list(c.shape), np.int64)
    shapes = comm.allgather(shape, timeout=timeout).reshape(size, c.dim())
    diff = _first_difference(shapes)
    if diff is not None:
        r, _ = diff
        raise ValueError(f"harp allreduce: sparse tensors differ across ranks: shape {shapes[0].tolist()} on rank 0, "
                         f"{shapes[r].tolist()} on rank {r}")
    nnz = [int(n) for n in heads[:, 0]]
    sd = c.sparse_dim()
    bad = _bad_nnz(nnz, list(c.shape[:sd]))
    if bad is not None:  # a peer's header sizes what this rank allocates: bounded before use
        raise ValueError(f"harp allreduce: rank {bad} announced {nnz[bad]} sparse entries, outside "
                         f"[0, {math.prod(c.shape[:sd])}] for shape {list(c.shape)}")
    total = sum(nnz)
    dense_shape = tuple(c.shape[sd:])
    per_entry = int(np.prod(dense_shape, dtype=np.int64)) * c.element_size()
    if total == 0:
        out = torch.sparse_coo_tensor(torch.zeros(sd, 0, dtype=torch.int64),
                                      torch.zeros((0,) + dense_shape, dtype=c.dtype), c.shape)
    else:
        idx = c.indices().t().contiguous().numpy()  # (nnz, sparse_dim)
        all_idx = np.empty((total, sd), np.int64)
        _gather_v(comm, idx.reshape(-1), all_idx.reshape(-1), [n * sd for n in nnz], timeout)
        val = c.values().contiguous().reshape(-1).view(torch.uint8).numpy()
        all_val = np.empty(total * per_entry, np.uint8)
        _gather_v(comm, val, all_val, [n * per_entry for n in nnz], timeout)
        values = torch.from_numpy(all_val).view(c.dtype).reshape((total,) + dense_shape)
        out = torch.sparse_coo_tensor(torch.from_numpy(all_idx).t(), values, c.shape).coalesce()
    if op_name == "AVG":
        v = out.values()
        v = torch.div(v, size, rounding_mode="trunc") if not (v.is_floating_point() or v.is_complex()) else v / size
        out = torch.sparse_coo_tensor(out.indices(), v, out.shape).coalesce()
    t.copy_(out.to(t.device))
    return t


def _gather_v(comm, send, recv, counts, timeout):
    """Every rank's `send` (counts[r] elements on rank r) into `recv`, in rank order."""
    size = comm.size
    mine = counts[comm.rank]
    comm.alltoallv(send, [mine] * size, recv, counts, sdispls=[0] * size, timeout=timeout)
