"""hvd.Compression: what a gradient is turned into on the wire, and back (Horovod's interface).

    compressed, ctx = Compression.fp16.compress(t)   # float32/64 -> float16; others unchanged
    t2 = Compression.fp16.decompress(compressed, ctx)

fp16 halves the bytes of a float32 allreduce at the cost of float16's range and
precision (sums over ranks are formed in float16; large gradients can overflow
to inf, as with Horovod's fp16 compression). HARP's top-k compression with error
feedback will register here when it exists.
"""
from __future__ import annotations

import torch


class Compressor:
    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
