"""nccl-tests' all_reduce_perf as the reference for the library all-reduce bar (when installed).

Both sides use the same statistic: nccl-tests times a block of ``-n`` back-to-back calls and
reports the time per call; it runs ``-N`` such cycles (one printed row each), as gpulab runs
``repeats`` blocks of ``iters`` calls, and the reference is the median over the cycles, like
gpulab's median over repetitions. The process models differ: all_reduce_perf ``-g n`` drives all
n GPUs from one process (one NCCL group call per step), gpulab runs one process per GPU.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess

from gpulab import launch, timing
from gpulab.collectives import formulas

log = logging.getLogger("gpulab.collectives")
COLUMNS = ("time_us", "algbw_GBps", "busbw_GBps", "wrong")


def find(path: str | None = None) -> str | None:
    """The all_reduce_perf binary: the configured path, else the one on PATH, else None."""
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"collectives.nccl_tests_bin: {path} is not an executable file")
        return path
    return shutil.which("all_reduce_perf")


def _num(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return math.nan  # "N/A" in the #wrong column


def parse(text: str) -> list[dict]:
    """Data rows of nccl-tests output: size, count, type, redop, [root,] then out-of-place and
    in-place (time, algbw, busbw, #wrong)."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or line.lstrip().startswith("#") or not parts[0].isdigit():
            continue
        if len(parts) not in (12, 13):
            continue
        head, tail = parts[:-8], parts[-8:]
        row = {"size_bytes": int(head[0]), "count": int(head[1]), "type": head[2], "redop": head[3]}
        for prefix, vals in (("oop", tail[:4]), ("ip", tail[4:])):
            row.update({f"{prefix}_{c}": _num(v) for c, v in zip(COLUMNS, vals)})
        rows.append(row)
    return rows


def run(exe: str, ngpus: int, size_bytes: int, warmup: int = 5, iters: int = 20, cycles: int = 5,
        timeout: float = 300, multicast: bool = False) -> list[dict]:
    """Run all_reduce_perf on this process's visible GPUs at one size; one parsed row per cycle."""
    cmd = [exe, "-b", str(size_bytes), "-e", str(size_bytes), "-g", str(ngpus),
           "-w", str(warmup), "-n", str(iters), "-N", str(cycles), "-c", "1"]
    log.info("nccl-tests: %s", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **({} if multicast else launch.SAFE_ENV)})
    rows = parse(p.stdout)
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n"
                           f"{p.stderr[-2000:]}")
    return rows


def reference(rows: list[dict], n: int) -> dict:
    """The in-place all-reduce figures over the cycles: median per-call time and its busbw."""
    times = [r["ip_time_us"] * 1e-6 for r in rows]
    st = timing.summarize(times)
    size = int(rows[0]["size_bytes"])
    return {"size_bytes": size, "cycles": st.n, "ip_time_s_median": st.median,
            "ip_busbw_GBps": formulas.busbw("all_reduce", n, size, st.median),
            "ip_busbw_GBps_reported": [r["ip_busbw_GBps"] for r in rows],
            "wrong": sum(0 if math.isnan(r["ip_wrong"]) else r["ip_wrong"] for r in rows)}
