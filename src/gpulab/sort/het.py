"""HET sort: the devices sort their chunks, the CPU merges the sorted runs (multiway merge)."""
from __future__ import annotations

import os

import numpy as np

from gpulab.sort.chunks import gather_to_host, offsets, scatter_to_devices
from gpulab.sort.merge import multiway_merge


def run(backend, host_in: np.ndarray, host_out: np.ndarray, timer, threads: int | None = None,
        observer=None) -> dict:
    """H2D, local sort on every device, D2H into a staging buffer, CPU multiway merge into out."""
    threads = threads or os.cpu_count() or 1
    with timer.phase("h2d"):
        chunks = scatter_to_devices(backend, host_in)
    with timer.phase("local_sort"):
        chunks = backend.run(lambda d: backend.sort(d, chunks[d]))
    if backend.n == 1:  # one run is already the answer: no merge
        with timer.phase("d2h"):
            gather_to_host(backend, chunks, host_out)
        return {"keys_moved": 0, "merge_parts": 0}
    staging = backend.host_empty(host_in.size, host_in.dtype)
    with timer.phase("d2h"):
        gather_to_host(backend, chunks, staging)
    off = offsets([c.size for c in chunks])
    runs = [staging[off[d]:off[d + 1]] for d in range(backend.n)]
    with timer.phase("merge"):
        parts = multiway_merge(runs, host_out, threads)
    # Keys cross the CPU-GPU link (D2H) but never the GPU-GPU interconnect.
    return {"keys_moved": 0, "merge_parts": parts}
