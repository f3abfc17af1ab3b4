"""Sizes, algorithm bandwidth and bus bandwidth exactly as nccl-tests defines them.

nccl-tests (doc/PERFORMANCE.md) reports for a collective of size S bytes taking t seconds:

    algbw = S / t                      (GB/s, 1 GB = 1e9 B)
    busbw = algbw * factor(op, n)

with factor = 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for
broadcast. S is the size of the whole array: for all-gather the gathered output (n x the per-rank
send count), for reduce-scatter the input (n x the per-rank receive count), for all-to-all one rank's
buffer. The per-rank "count" nccl-tests prints is the send count (all-gather), receive count
(reduce-scatter), per-peer count (all-to-all), or the buffer length (all-reduce, broadcast). Counts
are rounded down to a multiple of n as nccl-tests does (here to at least one element per rank).
The hand-written all-reduce algorithms (ring, tree, parameter server) leave every rank with the sum,
so they use the all-reduce factor: their busbw is directly comparable with the library's.
"""
from __future__ import annotations

from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
HANDWRITTEN = ("ring", "tree", "param_server")
ELEMENT_BYTES = 4  # float32 holding small integers: sums are exact


def bus_factor(op: str, n: int) -> float:
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    if op in ("all_reduce",) + HANDWRITTEN:
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r} (known: {', '.join(OPS + HANDWRITTEN)})")


@dataclass(frozen=True)
class Shape:
    """Element counts of one collective call at a requested size."""

    op: str
    n: int
    total: int  # elements of the array S counts (see module doc)
    count: int  # nccl-tests' per-rank "count" column

    @property
    def bytes(self) -> int:
        return self.total * ELEMENT_BYTES


def shape(op: str, size_bytes: int, n: int) -> Shape:
    """The collective's element counts for a requested size in bytes (rounded like nccl-tests)."""
    bus_factor(op, n)  # validates op and n
    if size_bytes < 1:
        raise ValueError(f"size must be a positive number of bytes, got {size_bytes}")
    elems = max(1, size_bytes // ELEMENT_BYTES)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        per_rank = max(1, elems // n)
        return Shape(op, n, per_rank * n, per_rank)
    return Shape(op, n, elems, elems)


def algbw(size_bytes: int, seconds: float) -> float:
    """GB/s (1e9 B/s)."""
    return size_bytes / seconds / 1e9 if seconds > 0 else float("nan")


def busbw(op: str, n: int, size_bytes: int, seconds: float) -> float:
    return algbw(size_bytes, seconds) * bus_factor(op, n)
