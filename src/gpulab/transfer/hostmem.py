"""Host-memory transfers: memcpy between buffers, between threads, and between CPU virtual devices.

These run on every host, so the stage has real numbers without a GPU. ``numpy.copyto`` is a plain
single-threaded memcpy that releases the GIL, so Python threads copy truly in parallel. Each virtual
device owns a source, a destination and an auxiliary buffer; a copy "i -> j" reads device i's
source and lands in device j's buffer, issued from a worker thread (one thread per direction, so a
bidirectional cell is two threads copying at once). Timestamps come from one shared clock
(``time.perf_counter``) inside the worker threads, so thread hand-off is not timed.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from gpulab.transfer.measure import (bandwidth_row, bytes_moved, copies_for, latency_row,
                                     random_bytes)


def _copy_loop(dst: np.ndarray, src: np.ndarray, copies: int, barrier=None) -> tuple[float, float]:
    if barrier is not None:
        barrier.wait()
    t0 = time.perf_counter()
    for _ in range(copies):
        np.copyto(dst, src)
    return t0, time.perf_counter()


def _concurrent(pool: ThreadPoolExecutor, jobs: list[tuple[np.ndarray, np.ndarray]], copies: int) -> float:
    """Run the copy jobs at once (one thread each, released together); wall time first start to last end."""
    barrier = threading.Barrier(len(jobs))
    futs = [pool.submit(_copy_loop, d, s, copies, barrier) for d, s in jobs]
    spans = [f.result() for f in futs]
    return max(e for _, e in spans) - min(s for s, _ in spans)


def _samples(fn, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    return [fn() for _ in range(repeats)]


def memcpy_sweep(sizes, warmup: int, repeats: int, copies: int, target_bytes: int, seed: int) -> pd.DataFrame:
    """One thread, buffer to buffer, at each size."""
    rows = []
    with ThreadPoolExecutor(1) as pool:
        for size in sizes:
            src, dst = random_bytes(size, seed + size), np.zeros(size, np.uint8)
            c = copies_for(size, copies, target_bytes)
            s = _samples(lambda: _concurrent(pool, [(dst, src)], c), warmup, repeats)
            row = bandwidth_row(s, bytes_moved(size, c, same_device=False), bytes=size, copies=c,
                                threads=1, verified=bool(np.array_equal(dst, src)))
            row["value_rw_median"] = 2 * row["value_median"]  # read+write view of the same copy
            rows.append(row)
    return pd.DataFrame(rows)


def thread_scaling(threads, size: int, warmup: int, repeats: int, copies: int, seed: int) -> pd.DataFrame:
    """T threads copy their own buffers at once: the aggregate host copy bandwidth vs thread count."""
    rows = []
    for t in threads:
        bufs = [(np.zeros(size, np.uint8), random_bytes(size, seed + 31 * k)) for k in range(t)]
        with ThreadPoolExecutor(t) as pool:
            s = _samples(lambda: _concurrent(pool, bufs, copies), warmup, repeats)
        ok = all(np.array_equal(d, s_) for d, s_ in bufs)
        rows.append(bandwidth_row(s, t * bytes_moved(size, copies, same_device=False), bytes=size,
                                  copies=copies, threads=t, verified=bool(ok)))
    return pd.DataFrame(rows)


class VirtualDevices:
    """Buffers of n CPU virtual devices, for the p2pBandwidthLatencyTest-shaped matrices."""

    def __init__(self, n: int, nbytes: int, seed: int):
        self.n, self.nbytes = n, nbytes
        self.src = [random_bytes(nbytes, seed + d) for d in range(n)]
        self.dst = [np.zeros(nbytes, np.uint8) for _ in range(n)]
        self.aux = [np.zeros(nbytes, np.uint8) for _ in range(n)]

    def matrices(self, warmup: int, repeats: int, copies: int, lat_bytes: int, lat_copies: int) -> pd.DataFrame:
        rows = []
        keys = dict(mechanism="memcpy", p2p="host", bytes=self.nbytes, clock="host perf_counter")
        with ThreadPoolExecutor(2) as pool:
            for i in range(self.n):
                for j in range(self.n):
                    same = i == j
                    # unidirectional i -> j
                    self.dst[j].fill(0)
                    s = _samples(lambda: _concurrent(pool, [(self.dst[j], self.src[i])], copies),
                                 warmup, repeats)
                    rows.append(bandwidth_row(s, bytes_moved(self.nbytes, copies, same_device=same),
                                              test="uni", metric="bandwidth", src=i, dst=j, copies=copies,
                                              verified=bool(np.array_equal(self.dst[j], self.src[i])), **keys))
                    # bidirectional: i -> j and j -> i at once (same device: two copies into two buffers)
                    back = (self.aux[i], self.src[i]) if same else (self.dst[i], self.src[j])
                    self.dst[j].fill(0)
                    back[0].fill(0)
                    jobs = [(self.dst[j], self.src[i]), back]
                    s = _samples(lambda: _concurrent(pool, jobs, copies), warmup, repeats)
                    ok = all(np.array_equal(d, s_) for d, s_ in jobs)
                    rows.append(bandwidth_row(s, bytes_moved(self.nbytes, copies, same_device=same,
                                                             bidirectional=True),
                                              test="bi", metric="bandwidth", src=i, dst=j, copies=copies,
                                              verified=bool(ok), **keys))
                    # latency of a small copy call issued by i's thread into j's buffer
                    d_, s_ = self.dst[j][:lat_bytes], self.src[i][:lat_bytes]
                    d_.fill(0)
                    s = _samples(lambda: _concurrent(pool, [(d_, s_)], lat_copies), warmup, repeats)
                    rows.append(latency_row(s, lat_copies, test="latency", metric="latency_cpu", src=i,
                                            dst=j,
                                            verified=bool(np.array_equal(d_, s_)),
                                            **{**keys, "bytes": lat_bytes}))
        return pd.DataFrame(rows)
