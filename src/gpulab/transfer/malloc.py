"""cudaMalloc cost vs the number of prior allocations, with and without peer access.

The seed quotes O(lg N) per cudaMalloc, and O(D lg N) once D peers have access (every new
allocation must be mapped into each peer); its author could not reproduce it. Here ``count``
allocations are made one after another with raw ``cudaMalloc`` (no CuPy pool), each timed with the
host clock, and the times are grouped into power-of-two bins of the prior-allocation count. The
first ``warmup`` rounds are discarded (they include the context's first heap growth).
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from gpulab import timing
from gpulab.transfer import cudart as cr


def _bins(count: int) -> list[tuple[int, int]]:
    edges = [0, 1]
    while edges[-1] < count:
        edges.append(edges[-1] * 2)
    return [(a, min(b, count)) for a, b in zip(edges[:-1], edges[1:]) if a < count]


def malloc_cost(device: int, count: int, nbytes: int, warmup: int, rounds: int, peers: int,
                peer_access: str) -> pd.DataFrame:
    times = np.zeros((rounds, count))
    with cr.on(device):
        r = cr.rt()
        for rnd in range(warmup + rounds):
            ptrs = []
            for k in range(count):
                t0 = time.perf_counter()
                ptrs.append(r.malloc(nbytes))
                dt = time.perf_counter() - t0
                if rnd >= warmup:
                    times[rnd - warmup, k] = dt
            for p in ptrs:
                r.free(p)
    return bin_times(times, peer_access=peer_access, peers=peers, device=device, alloc_bytes=nbytes)


def bin_times(times: np.ndarray, **keys) -> pd.DataFrame:
    """rounds x count call times (s) -> one row per power-of-two bin of prior allocations (us)."""
    rows = []
    for a, b in _bins(times.shape[1]):
        st = timing.summarize(times[:, a:b].ravel().tolist())
        rows.append({**keys, "prior_from": a, "prior_to": b - 1, "samples": st.n,
                     "time_us_median": st.median * 1e6, "time_us_min": st.min * 1e6,
                     "time_us_max": st.max * 1e6})
    return pd.DataFrame(rows)
