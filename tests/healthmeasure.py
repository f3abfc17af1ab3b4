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

TRANSFER = {"warmup": 1, "repeats": 5, "copies": 24, "matrix_bytes": 4 << 20, "latency_bytes": 16,
            "latency_copies": 100, "host_sizes": [4 << 20], "sweep_target_bytes": 96 << 20,
            "host_threads": [1], "host_threads_bytes": 4 << 20}
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


def measure_host(root: Path, host: str, *, slow: bool = False) -> float:
    """transfer + gemm results of `host` under root/<stage>/<host>/main.h5.

    Returns the share of the wall time this process got the CPU (process CPU time / wall time):
    other tenants of a shared machine show up as a low share.
    """
    import torch

    from gpulab import transfer
    from gpulab.gemm import numerics, single
    from gpulab.stage import StageContext

    old = os.environ.get("GPULAB_HOST")
    os.environ["GPULAB_HOST"] = host
    t0, c0 = time.perf_counter(), os.times()
    try:
        with degraded() if slow else contextlib.nullcontext():
            out = root / "transfer" / host / "main.h5"
            ctx = StageContext("transfer", "main", dict(TRANSFER), {"backend": "cpu", "cpu_devices": 2}, out)
            paths = [results.write(transfer.run(ctx), out)]
            rows = single.baseline(torch.device("cpu"), [GEMM_SIZE], [numerics.precision("fp32")],
                                   1, 5, 0)
            r = results.Result("gemm", "main", {"sizes": [GEMM_SIZE]}, "cpu")
            r.add_table("single", pd.DataFrame(rows))
            paths.append(results.write(r, root / "gemm" / host / "main.h5"))
        c1 = os.times()
        return (c1.user + c1.system - c0.user - c0.system) / (time.perf_counter() - t0)
    finally:
        if old is None:
            os.environ.pop("GPULAB_HOST", None)
        else:
            os.environ["GPULAB_HOST"] = old
