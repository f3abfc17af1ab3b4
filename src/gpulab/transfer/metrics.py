"""The transfer stage's metrics for baselines and the fleet view (hook of its StageSpec).

Every table whose rows carry ``samples_s`` (seconds per repetition, JSON) and ``unit``:
GB/s = bytes_per_sample / seconds, us = seconds / copies (the stage's own conventions).

Class (see :mod:`gpulab.metrics`): copies timed on the device (CUDA events: pinned H2D/D2H, the P2P
matrix and its diagonal = HBM copy, GPU-side latency) gate; what the host CPU and page cache decide
informs only: pageable copies, copies timed with the host clock (``call=sync``), CPU-side latency,
host memcpy and thread scaling, allocation. On a CPU host the copies between virtual devices (the
P2P matrix) are the "device" measurement and gate; host memcpy and CPU-side latency inform.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from gpulab import metrics as m
from gpulab import results

# Columns of transfer rows that are measurements, not part of what was measured.
_VALUE_COLS = {
    "bytes_per_sample", "time_s_median", "time_s_min", "time_s_max", "value_median", "value_min",
    "value_max", "value_rw_median", "spread", "repeats", "unit", "samples_s", "verified", "clock",
    "copies", "note",
}
# Float columns that are settings (hybrid's split ratio), so part of a metric's identity.
_IDENT_FLOATS = {"ratio_R"}
_KEYED = ("src", "dst", "bytes", "threads", "gpu", "device", "gpus", "ratio_R")
# Host-side tables: the CPU and page cache decide them.
_HOST_TABLES = {"host_memcpy", "host_threads", "host_device_threads", "malloc"}
_HOST_WORDS = ("pageable", "latency_cpu", "/sync/")


def _derived(col: pd.Series) -> bool:
    """A float column with fractional values (e.g. hybrid's speedup) is a result, not part of what
    was measured: in a metric's name it would make every run's metric a new one."""
    if not pd.api.types.is_float_dtype(col) or col.name in _IDENT_FLOATS:
        return False
    v = col.dropna().to_numpy()
    return bool(len(v)) and not bool((v == v.round()).all())


def _ident(row: pd.Series, cols: Iterable[str]) -> str:
    parts = []
    for c in cols:
        v = row[c]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        parts.append(f"{c}={v}" if c in _KEYED else str(v))
    return "/".join(parts)


def metric_class(table: str, metric: str) -> str:
    if table in _HOST_TABLES or any(w in metric + "/" for w in _HOST_WORDS):
        return m.INFORMATIONAL
    return m.GATING


def extract(path: Path, a: dict, group: str) -> list[dict]:
    out = []
    for name in results.list_contents(path)["tables"]:
        df = results.read_table(path, name)
        if not {"samples_s", "unit"} <= set(df.columns):
            continue
        ident = [c for c in df.columns if c not in _VALUE_COLS and not _derived(df[c])]
        for _, r in df.iterrows():
            secs = m.json_list(r["samples_s"])
            if r["unit"] == "GB/s":
                vals, better = [r["bytes_per_sample"] / s / 1e9 for s in secs if s > 0], m.HIGHER
            elif r["unit"] == "us":
                vals, better = [s / r["copies"] * 1e6 for s in secs], m.LOWER
            else:
                continue
            metric = f"transfer/{name}/{_ident(r, ident)}"
            out += m.rows(group, a["host"], "transfer", metric, r["unit"], better, vals,
                          metric_class(name, metric))
    return out
