"""nccl-tests' all_reduce_perf as the reference for the library all-reduce bar (when installed)."""
from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess

from gpulab import launch

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


def run(exe: str, ngpus: int, size_bytes: int, warmup: int = 5, iters: int = 20,
        timeout: float = 300) -> dict:
    """Run all_reduce_perf on this process's visible GPUs at one size; the parsed row."""
    cmd = [exe, "-b", str(size_bytes), "-e", str(size_bytes), "-g", str(ngpus),
           "-w", str(warmup), "-n", str(iters), "-c", "1"]
    log.info("nccl-tests: %s", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **launch.SAFE_ENV})
    rows = parse(p.stdout)
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n"
                           f"{p.stderr[-2000:]}")
    return rows[-1]
