"""nccl-tests' all_reduce_perf as the reference for the library all-reduce bar (when installed).

Both sides use the same statistic: nccl-tests times a block of ``-n`` back-to-back calls and
reports the time per call; it runs ``-N`` such cycles (one printed row each), as gpulab runs
``repeats`` blocks of ``iters`` calls, and the reference is the median over the cycles, like
gpulab's median over repetitions. The process models differ: all_reduce_perf ``-g n`` drives all
n GPUs from one process (one NCCL group call per step), gpulab runs one process per GPU.
"""
from __future__ import annotations

import functools
import glob
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile

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


# JSON field -> the text parser's column (time is "cpu_time" when nccl-tests runs with -C 1).
_JSON_FIELDS = {"time": "time_us", "cpu_time": "time_us", "alg_bw": "algbw_GBps",
                "bus_bw": "busbw_GBps", "nwrong": "wrong"}


def _jnum(v) -> float:
    # nccl-tests writes NaN as the string "nan" and an unchecked #wrong as null
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def parse_json(doc: str | dict) -> list[dict]:
    """Data rows of nccl-tests' JSON output (``-J <file>``), in the text parser's columns."""
    if isinstance(doc, str):
        doc = json.loads(doc)
    rows = []
    for r in doc.get("results") or []:
        row = {"size_bytes": int(r["size"]), "count": int(r["count"]), "type": r["type"],
               "redop": r["redop"]}
        for prefix, key in (("oop", "out_of_place"), ("ip", "in_place")):
            part = r.get(key) or {}
            row.update({f"{prefix}_{c}": math.nan for c in COLUMNS})
            row.update({f"{prefix}_{_JSON_FIELDS[k]}": _jnum(v) for k, v in part.items()
                        if k in _JSON_FIELDS})
        rows.append(row)
    return rows


@functools.lru_cache(maxsize=8)
def supports_json(exe: str) -> bool:
    """Whether this all_reduce_perf build has ``-J`` (JSON output; nccl-tests 2025 and later):
    its usage text lists the option. Older builds fall back to the text parser."""
    try:
        p = subprocess.run([exe, "-h"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"(^|[\s\[,])-J\b", p.stdout + p.stderr, re.M) is not None


def _json_rows(out_dir: str, stem: str) -> list[dict]:
    # nccl-tests never overwrites: an existing file makes it write <file>.0, <file>.1, ...
    for path in sorted(glob.glob(os.path.join(out_dir, stem + "*"))):
        try:
            with open(path) as f:
                rows = parse_json(f.read())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("nccl-tests: %s is not readable JSON (%s); using the text output", path, exc)
            continue
        if rows:
            return rows
    return []


def run(exe: str, ngpus: int, size_bytes: int, warmup: int = 5, iters: int = 20, cycles: int = 5,
        timeout: float = 300, multicast: bool = False) -> list[dict]:
    """Run all_reduce_perf on this process's visible GPUs at one size; one parsed row per cycle
    (from its JSON output where the build has -J, else from its text)."""
    cmd = [exe, "-b", str(size_bytes), "-e", str(size_bytes), "-g", str(ngpus),
           "-w", str(warmup), "-n", str(iters), "-N", str(cycles), "-c", "1"]
    with tempfile.TemporaryDirectory(prefix="gpulab-nccltests-") as tmp:
        use_json = supports_json(exe)
        if use_json:
            cmd += ["-J", os.path.join(tmp, "nccl.json")]
        log.info("nccl-tests: %s", " ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **({} if multicast else launch.SAFE_ENV)})
        rows = _json_rows(tmp, "nccl.json") if use_json else []
    rows = rows or parse(p.stdout)
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
