"""Comparable metrics with their samples, read from result files (for baselines and the fleet view).

A *metric* is one measured quantity that means the same thing on every host and in every run of
the same configuration, e.g. ``transfer/p2p/uni/ce/enabled/src=0/dst=1`` (GB/s, higher is better).
Each comes with every repetition's value (its *samples*), so comparisons can respect noise.

Sources (each stage's tables stay its own; this module only reads them):

- transfer: every table whose rows carry ``samples_s`` (seconds per repetition, JSON) and ``unit``:
  GB/s = bytes_per_sample / seconds, us = seconds / copies (the stage's own conventions);
- collectives: the ``samples`` table (seconds per call per repetition) -> busbw (nccl-tests), or
  algbw where the bus factor is 0 (one rank);
- gemm: the ``single`` table's ``time_s_samples`` -> TFLOP/s;
- probe: per GPU, the state a sick node shows (PCIe generation and width, active NVLinks, max SM
  clock, uncorrected ECC errors, hardware/thermal clock slowdowns), one sample each.

Every metric row also carries the host, the device kind and the *group* (device kind + GPU model):
hosts are compared only within a group.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable

import pandas as pd

from gpulab import results


COLUMNS = ["group", "host", "stage", "metric", "unit", "better", "sample", "value"]
HIGHER, LOWER = "higher", "lower"

# Columns of transfer rows that are measurements, not part of what was measured.
_TRANSFER_VALUE_COLS = {
    "bytes_per_sample", "time_s_median", "time_s_min", "time_s_max", "value_median", "value_min",
    "value_max", "value_rw_median", "spread", "repeats", "unit", "samples_s", "verified", "clock",
    "copies", "note",
}
# Float columns that are settings (hybrid's split ratio), so part of a metric's identity.
_TRANSFER_IDENT_FLOATS = {"ratio_R"}
# NVML clock event reasons that mean the hardware or the driver held clocks down (idle, app
# clocks and sync boost are normal operation).
_SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # sw power cap, hw slowdown, sw/hw thermal, power brake


def _json_list(v) -> list[float]:
    if isinstance(v, (list, tuple)):
        return [float(x) for x in v]
    try:
        return [float(x) for x in json.loads(v)]
    except (TypeError, ValueError):
        return []


def _derived(col: pd.Series) -> bool:
    """A float column with fractional values (e.g. hybrid's speedup) is a result, not part of what
    was measured: in a metric's name it would make every run's metric a new one."""
    if not pd.api.types.is_float_dtype(col) or col.name in _TRANSFER_IDENT_FLOATS:
        return False
    v = col.dropna().to_numpy()
    return bool(len(v)) and not bool((v == v.round()).all())


def _ident(row: pd.Series, cols: Iterable[str]) -> str:
    parts = []
    for c in cols:
        v = row[c]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        parts.append(f"{c}={v}" if c in ("src", "dst", "bytes", "threads", "gpu", "device", "gpus", "ratio_R") else str(v))
    return "/".join(parts)


def _rows(group, host, stage, metric, unit, better, values) -> list[dict]:
    return [{"group": group, "host": host, "stage": stage, "metric": metric, "unit": unit,
             "better": better, "sample": i, "value": float(v)} for i, v in enumerate(values)
            if v is not None and math.isfinite(float(v))]


def _transfer(path: Path, a: dict, group: str) -> list[dict]:
    out = []
    for name in results.list_contents(path)["tables"]:
        df = results.read_table(path, name)
        if not {"samples_s", "unit"} <= set(df.columns):
            continue
        ident = [c for c in df.columns if c not in _TRANSFER_VALUE_COLS and not _derived(df[c])]
        for _, r in df.iterrows():
            secs = _json_list(r["samples_s"])
            if r["unit"] == "GB/s":
                vals, better = [r["bytes_per_sample"] / s / 1e9 for s in secs if s > 0], HIGHER
            elif r["unit"] == "us":
                vals, better = [s / r["copies"] * 1e6 for s in secs], LOWER
            else:
                continue
            metric = f"transfer/{name}/{_ident(r, ident)}"
            out += _rows(group, a["host"], "transfer", metric, r["unit"], better, vals)
    return out


def _collectives(path: Path, a: dict, group: str) -> list[dict]:
    from gpulab.collectives import formulas

    if "samples" not in results.list_contents(path)["tables"]:
        return []
    s = results.read_table(path, "samples")
    n = int(a.get("world_size") or 1)
    out = []
    for (kind, op, mode, size), g in s.groupby(["kind", "op", "mode", "bytes"], sort=True):
        times = [float(t) for t in g.sort_values("repetition")["time_s"]]
        use_bus = formulas.bus_factor(op, n) > 0
        vals = [formulas.busbw(op, n, int(size), t) if use_bus else formulas.algbw(int(size), t)
                for t in times if t > 0]
        what = "busbw" if use_bus else "algbw"
        metric = f"collectives/{a.get('variant', 'default')}/{kind}/{op}/{mode}/bytes={int(size)}/{what}"
        out += _rows(group, a["host"], "collectives", metric, "GB/s", HIGHER, vals)
    return out


def _gemm(path: Path, a: dict, group: str) -> list[dict]:
    if "single" not in results.list_contents(path)["tables"]:
        return []
    df = results.read_table(path, "single")
    if "time_s_samples" not in df.columns:
        return []
    out = []
    for _, r in df.iterrows():
        flop = 2.0 * int(r["M"]) * int(r["N"]) * int(r["K"])
        vals = [flop / t / 1e12 for t in _json_list(r["time_s_samples"]) if t > 0]
        metric = f"gemm/single/{r['dtype']}/{int(r['M'])}x{int(r['N'])}x{int(r['K'])}"
        out += _rows(group, a["host"], "gemm", metric, "TFLOP/s", HIGHER, vals)
    return out


def _probe(path: Path, a: dict, group: str) -> list[dict]:
    if not a.get("has_gpus"):
        return []
    out = []
    gpus = results.read_table(path, "gpus")
    state = [("pcie_gen_now", "gen", HIGHER), ("pcie_width_now", "lanes", HIGHER),
             ("sm_clock_max_mhz", "MHz", HIGHER), ("ecc_uncorrected_volatile", "errors", LOWER)]
    for _, g in gpus.iterrows():
        i = int(g["index"])
        for col, unit, better in state:
            # the probe writes -1 where NVML did not answer: unknown, not zero
            if col in gpus.columns and float(g[col]) >= 0:
                out += _rows(group, a["host"], "probe", f"probe/gpu={i}/{col}", unit, better, [g[col]])
        if "throttle_reasons" in gpus.columns and float(g["throttle_reasons"]) >= 0:
            bits = bin(int(g["throttle_reasons"]) & _SLOWDOWN_BITS).count("1")
            out += _rows(group, a["host"], "probe", f"probe/gpu={i}/clock_slowdown_reasons",
                         "reasons", LOWER, [bits])
    if "nvlinks" in results.list_contents(path)["tables"]:
        links = results.read_table(path, "nvlinks")
        if "active" in links.columns:
            for gpu, g in links.groupby("gpu"):
                active = sum(1 for v in g["active"] if str(v).lower() in ("true", "1", "1.0"))
                out += _rows(group, a["host"], "probe", f"probe/gpu={int(gpu)}/nvlinks_active",
                             "links", HIGHER, [active])
    return out


EXTRACTORS = {"transfer": _transfer, "collectives": _collectives, "gemm": _gemm, "probe": _probe}


def _models(a: dict) -> list[str]:
    for key in ("device_names", "gpu_names", "device_name"):
        v = a.get(key)
        if v:
            return [str(x) for x in (v if isinstance(v, list) else [v])]
    return []


def group_of(device_kind: str, models: Iterable[str]) -> str:
    """'cuda: NVIDIA H200' / 'cpu: CPU virtual devices': hosts are compared only within a group."""
    if device_kind != "cuda":
        return f"{device_kind}: CPU virtual devices"
    names = sorted(set(models))
    return f"cuda: {' + '.join(names) if names else 'unknown GPU'}"


def _probe_models(files: list[tuple[Path, dict]]) -> dict[str, list[str]]:
    """GPU names per host from the probe results (for results that do not name their GPUs)."""
    out = {}
    for f, a in files:
        if a.get("stage") == "probe" and a.get("has_gpus"):
            out[str(a.get("host"))] = [str(n) for n in results.read_table(f, "gpus")["name"]]
    return out


def collect(files: Iterable[str | Path]) -> pd.DataFrame:
    """Every metric sample of the given result files (columns :data:`COLUMNS`)."""
    readable = list(results.with_attrs(files, "metrics"))
    probe_models = _probe_models(readable)
    rows: list[dict] = []
    for f, a in readable:
        fn = EXTRACTORS.get(str(a["stage"]))
        if fn is None:
            continue
        kind = str(a.get("device_kind") or ("cuda" if a.get("has_gpus") else "cpu"))
        models = probe_models.get(str(a.get("host"))) or _models(a)
        if a["stage"] == "probe" and a.get("has_gpus"):
            models = probe_models.get(str(a.get("host")), models)
        rows += fn(f, a, group_of(kind, models))
    return pd.DataFrame(rows, columns=COLUMNS)


def find(results_dir: str | Path = "results") -> pd.DataFrame:
    return collect(results.find_results(results_dir))
