"""The library's collectives (torch.distributed: NCCL on GPUs, gloo on CPU) as benchmark cases.

torch.distributed exposes all_reduce and broadcast only in place, and all_to_all_single only out of
place; all-gather and reduce-scatter run both ways (in place: the rank's slice of the big buffer is
the small one, which NCCL recognises as in-place). :data:`UNSUPPORTED` says why a mode is missing.
"""
from __future__ import annotations

import math

from gpulab.collectives import formulas
from gpulab.collectives.bench import Case
from gpulab.collectives.data import Patterns, compare

MODES = ("out-of-place", "in-place")
UNSUPPORTED = {
    ("all_reduce", "out-of-place"): "torch.distributed.all_reduce is in-place only",
    ("broadcast", "out-of-place"): "torch.distributed.broadcast is in-place only",
    ("all_to_all", "in-place"): "all_to_all_single needs distinct input and output buffers",
}


def make_case(op: str, mode: str, size_bytes: int, pats: Patterns, rank: int, n: int) -> Case | None:
    """The case for (op, mode) at a requested size, or None where torch has no such call."""
    import torch
    import torch.distributed as dist

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if (op, mode) in UNSUPPORTED:
        return None
    sh = formulas.shape(op, size_bytes, n)
    dev, c, total = pats.device, sh.count, sh.total
    mine = slice(rank * c, (rank + 1) * c)

    def nan(numel):
        return torch.full((numel,), math.nan, dtype=torch.float32, device=dev)

    if op == "all_reduce":
        buf = pats.rank_buffer(rank, total)
        orig = buf.clone()
        return Case("library", op, mode, sh.bytes, c, lambda: dist.all_reduce(buf),
                    lambda: buf.copy_(orig), lambda: compare(buf, pats.sum_buffer(total)), buf)
    if op == "broadcast":
        buf = pats.rank_buffer(rank, total)
        orig = buf.clone()
        return Case("library", op, mode, sh.bytes, c, lambda: dist.broadcast(buf, src=0),
                    lambda: buf.copy_(orig), lambda: compare(buf, pats.rank_buffer(0, total)), buf)
    if op == "all_gather":
        def expected():
            return torch.cat([pats.rank_buffer(j, c) for j in range(n)])

        if mode == "out-of-place":
            inp, out = pats.rank_buffer(rank, c), nan(total)
            return Case("library", op, mode, sh.bytes, c,
                        lambda: dist.all_gather_into_tensor(out, inp),
                        lambda: out.fill_(math.nan), lambda: compare(out, expected()), out)
        buf, part = nan(total), pats.rank_buffer(rank, c)

        def restore():
            buf.fill_(math.nan)
            buf[mine].copy_(part)

        return Case("library", op, mode, sh.bytes, c,
                    lambda: dist.all_gather_into_tensor(buf, buf[mine]), restore,
                    lambda: compare(buf, expected()), buf)
    if op == "reduce_scatter":
        if mode == "out-of-place":
            inp, out = pats.rank_buffer(rank, total), nan(c)
            return Case("library", op, mode, sh.bytes, c,
                        lambda: dist.reduce_scatter_tensor(out, inp), lambda: out.fill_(math.nan),
                        lambda: compare(out, pats.sum_buffer(c, start=rank * c)), out)
        buf = pats.rank_buffer(rank, total)
        orig = buf.clone()
        return Case("library", op, mode, sh.bytes, c,
                    lambda: dist.reduce_scatter_tensor(buf[mine], buf), lambda: buf.copy_(orig),
                    lambda: compare(buf[mine], pats.sum_buffer(c, start=rank * c)), buf[mine])
    if op == "all_to_all":
        inp, out = pats.rank_buffer(rank, total), nan(total)
        return Case("library", op, mode, sh.bytes, c, lambda: dist.all_to_all_single(out, inp),
                    lambda: out.fill_(math.nan),
                    lambda: compare(out, torch.cat([pats.rank_buffer(j, c, start=rank * c)
                                                    for j in range(n)])), out)
    raise ValueError(f"unknown collective {op!r}")
