"""Real health measurements on the CPU machine under a chosen host label, optionally degraded.

The tests call the stages' own measurement code (transfer's CPU path, gemm's single-device
baseline) at small sizes, and write results exactly where a run of that host would.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from gpulab import results

# Buffers larger than the last-level cache: in-cache copies swing several-fold with what other
# processes do to the cache; memory-bound ones much less.
TRANSFER = {"warmup": 1, "repeats": 5, "copies": 3, "matrix_bytes": 32 << 20, "latency_bytes": 16,
            "latency_copies": 100, "host_sizes": [32 << 20], "sweep_target_bytes": 96 << 20,
            "host_threads": [1], "host_threads_bytes": 32 << 20}
GEMM_SIZE = [768, 768, 768]


@contextlib.contextmanager
def degraded(burners: int = 5):
    """Pin this thread (and threads it starts) to one core that `burners` busy loops share, and
    give torch one thread: a node with a stuck, oversubscribed CPU. Everything is undone after."""
    import torch

    cpu = sorted(os.sched_getaffinity(0))[-1]
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
             for _ in range(burners)]
    try:
        os.sched_setaffinity(0, {cpu})
        torch.set_num_threads(1)
        yield
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _machine_busy() -> float:
    """CPU seconds every process of the machine has used (all cores), as the kernel counts them."""
    import psutil

    t = psutil.cpu_times()._asdict()
    # guest time is counted inside user time already; idle and I/O wait are no one's work
    return sum(v for k, v in t.items() if k not in ("idle", "iowait", "guest", "guest_nice"))


@contextlib.contextmanager
def _clock():
    """Wall and CPU seconds (all threads of this process) of the measurement alone, and the CPU
    seconds the rest of the machine used meanwhile (``others``: processes this one started and
    waited for count as its own)."""
    out = {}
    t0, c0, m0 = time.perf_counter(), os.times(), _machine_busy()
    yield out
    c1, m1 = os.times(), _machine_busy()
    out["wall"], out["cpu"] = time.perf_counter() - t0, c1.user + c1.system - c0.user - c0.system
    waited = c1.children_user + c1.children_system - c0.children_user - c0.children_system
    out["others"] = max(0.0, m1 - m0 - out["cpu"] - waited)


def machine_state(seconds: float = 0.3) -> tuple[float, float]:
    """(CPU share a busy loop gets, GB/s of a plain 32 MiB memcpy) right now: what other tenants of
    the machine leave to this process (1.0 of a core on an idle machine)."""
    import numpy as np

    with _clock() as c:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    a = np.ones(32 << 20, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    # The median of several short rounds: one round (~20 ms) can be hit by a page reclaim or a
    # scheduler hiccup, and a single low reference once made every later host look "busy".
    rates = []
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(2):
            np.copyto(b, a)
        rates.append(2 * a.nbytes / (time.perf_counter() - t0) / 1e9)
    return c["cpu"] / c["wall"], float(np.median(rates))


def measure_host(root: Path, host: str, *, slow: bool = False) -> tuple[float, float]:
    """transfer + gemm results of `host` under root/<stage>/<host>/main.h5.

    Returns (the share of the wall time this process got the CPU: its CPU time / wall time; the
    cores the machine's other processes kept busy meanwhile: their CPU time / wall time). Other
    tenants of a shared machine show up as a low share, or, where they took the other core (a
    2-thread GEMM then runs at a third of its speed, with this process's share still full), as
    busy cores of others."""
    import torch

    from gpulab import transfer
    from gpulab.gemm import numerics, single
    from conftest import stage_context

    old = os.environ.get("GPULAB_HOST")
    os.environ["GPULAB_HOST"] = host
    wall = cpu = others = 0.0
    try:
        with degraded() if slow else contextlib.nullcontext():
            out = root / "transfer" / host / "main.h5"
            ctx = stage_context("transfer", "main", TRANSFER, {"backend": "cpu", "cpu_devices": 2},
                                out)
            with _clock() as c:
                res = transfer.run(ctx)
            wall, cpu, others = wall + c["wall"], cpu + c["cpu"], others + c["others"]
            results.write(res, out)
            with _clock() as c:
                rows = single.baseline(torch.device("cpu"), [GEMM_SIZE], [numerics.precision("fp32")],
                                       1, 5, 0)
            wall, cpu, others = wall + c["wall"], cpu + c["cpu"], others + c["others"]
            r = results.Result("gemm", "main", {"sizes": [GEMM_SIZE]}, "cpu")
            r.add_table("single", pd.DataFrame(rows))
            results.write(r, root / "gemm" / host / "main.h5")
        return cpu / wall, others / wall
    finally:
        if old is None:
            os.environ.pop("GPULAB_HOST", None)
        else:
            os.environ["GPULAB_HOST"] = old
