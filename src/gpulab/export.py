"""Every result table as one tidy long table: one row per measured value, for tools other than gpulab.

A row says what was measured (stage, variant, table, metric and the row's *keys*: the columns that
name what was measured, e.g. bytes, dtype, src/dst), the value with its unit and statistic (median,
min, max, mean, stdev, sample, or value for a single reading), and where it came from (host, GPU
model, device kind, commit, config hash, time the result was written, result id).

Which columns are values: floating-point columns (times, bandwidths, ratios) and the per-repetition
lists (``samples_s``, ``time_s_samples``: JSON lists, one row per sample). Every other column (text,
integers, booleans) is a key: integer columns in gpulab's tables are sizes, counts and ids, i.e. what
was measured. A column named ``unit`` holds the unit of that row's values; a unit text "see column
X" (gpulab.energy's rows: work in GB, GFLOP or samples) takes the row's column X. NaN (not measured)
values are left out. Matrices (bandwidth src x dst) come as table ``matrix/<name>`` with keys row
and col.

Formats: Parquet (pyarrow), CSV and JSON Lines; :func:`read` reads any of them back.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from gpulab import results

COLUMNS = ["stage", "variant", "table", "metric", "keys", "value", "unit", "statistic", "sample",
           "host", "gpu_model", "device_kind", "commit", "git_dirty", "config_hash", "time",
           "result_id"]
FORMATS = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl"}
STATISTICS = ("median", "min", "max", "mean", "stdev", "p50", "p90", "p99")
# Per-repetition lists (JSON text in the HDF5 tables): their metric and unit.
SAMPLE_COLUMNS = {"samples_s": ("time", "s"), "time_s_samples": ("time", "s")}
# Free text: neither a value nor part of what was measured.
TEXT_COLUMNS = {"note", "traceback", "error"}
# Row-level unit column, and the unit text that defers to it (or to another column of the row).
UNIT_COLUMN = "unit"
SEE_COLUMN = re.compile(r"see column '?(\w+)'?")


class ExportError(ValueError):
    """A bad filter or an unreadable export file (the message names it)."""


def _split_stat(col: str) -> tuple[str, str]:
    for s in STATISTICS:
        if col.endswith("_" + s):
            return col[: -len(s) - 1], s
    return col, "value"


def _is_value(s: pd.Series) -> bool:
    return pd.api.types.is_float_dtype(s) and not pd.api.types.is_bool_dtype(s)


def _key_value(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def gpu_models(files: list[tuple[Path, dict]]) -> dict[str, str]:
    """GPU model per host, from the probe results ('' where a host has no probe or no GPU)."""
    out = {}
    for f, a in files:
        if a.get("stage") == "probe" and a.get("has_gpus"):
            names = sorted({str(n) for n in results.read_table(f, "gpus")["name"]})
            out[str(a.get("host"))] = " + ".join(names)
    return out


def model_of(a: dict, probe_models: dict[str, str]) -> str:
    if str(a.get("device_kind")) == "cpu" or (a.get("stage") == "probe" and not a.get("has_gpus")):
        return "cpu"
    m = probe_models.get(str(a.get("host")))
    if m:
        return m
    for key in ("device_names", "gpu_names", "device_name"):
        v = a.get(key)
        if v:
            return " + ".join(sorted({str(x) for x in (v if isinstance(v, list) else [v])}))
    return "unknown"


def table_rows(df: pd.DataFrame, table: str) -> list[dict]:
    """The long rows (metric, keys, value, unit, statistic, sample) of one table."""
    units = df.attrs.get("units", {}) or {}
    value_cols = [c for c in df.columns if _is_value(df[c]) and c not in TEXT_COLUMNS]
    sample_cols = [c for c in df.columns if c in SAMPLE_COLUMNS]
    key_cols = [c for c in df.columns if c not in value_cols and c not in sample_cols
                and c not in TEXT_COLUMNS and c != UNIT_COLUMN]
    has_unit_col = UNIT_COLUMN in df.columns
    out = []
    for rec in df.to_dict("records"):
        keys = json.dumps({k: _key_value(rec[k]) for k in key_cols}, sort_keys=True, default=str)
        row_unit = str(rec[UNIT_COLUMN]) if has_unit_col else ""
        for c in value_cols:
            v = rec[c]
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            metric, stat = _split_stat(str(c))
            unit = str(units.get(c, ""))
            see = SEE_COLUMN.match(unit)
            if see and see.group(1) in rec:
                unit = str(rec[see.group(1)])
            elif has_unit_col and (not unit or see):
                unit = row_unit
            out.append({"table": table, "metric": metric, "keys": keys, "value": float(v),
                        "unit": unit, "statistic": stat, "sample": -1})
        for c in sample_cols:
            metric, unit = SAMPLE_COLUMNS[c]
            try:
                vals = json.loads(rec[c]) if isinstance(rec[c], str) and rec[c] else []
            except json.JSONDecodeError:
                vals = []
            for i, v in enumerate(vals):
                out.append({"table": table, "metric": metric, "keys": keys, "value": float(v),
                            "unit": unit, "statistic": "sample", "sample": i})
    return out


def matrix_rows(data: np.ndarray, meta: dict, name: str) -> list[dict]:
    if data.dtype.kind not in "fiu" or data.ndim != 2:
        return []
    rows_l = meta.get("rows") or [str(i) for i in range(data.shape[0])]
    cols_l = meta.get("cols") or [str(j) for j in range(data.shape[1])]
    out = []
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            v = float(data[i, j])
            if math.isnan(v):
                continue
            out.append({"table": f"matrix/{name}", "metric": name,
                        "keys": json.dumps({"col": cols_l[j], "row": rows_l[i]}, sort_keys=True),
                        "value": v, "unit": str(meta.get("unit", "")), "statistic": "value",
                        "sample": -1})
    return out


def _since(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ExportError(f"--since {value!r}: not an ISO date or time (e.g. 2026-12-03 or "
                          "2026-12-03T10:00)") from None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _finished(a: dict) -> dt.datetime | None:
    with contextlib.suppress(TypeError, ValueError):
        t = dt.datetime.fromisoformat(str(a.get("finished_at")))
        return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    return None


def select(readable: list[tuple[Path, dict]], stages: Iterable[str] | None = None,
           hosts: Iterable[str] | None = None, since: str | None = None) -> list[tuple[Path, dict]]:
    """The (path, attrs) of ``readable`` that pass the stage, host and time filters."""
    stages, hosts, t0 = set(stages or ()), set(hosts or ()), _since(since)
    return [(f, a) for f, a in readable
            if (not stages or str(a["stage"]) in stages)
            and (not hosts or str(a.get("host")) in hosts)
            and (t0 is None or (_finished(a) is not None and _finished(a) >= t0))]


def tidy(files: Iterable[str | os.PathLike], stages: Iterable[str] | None = None,
         hosts: Iterable[str] | None = None, since: str | None = None) -> pd.DataFrame:
    """The long table of ``files`` (columns :data:`COLUMNS`), filtered by stage, host and time."""
    readable = list(results.with_attrs(files, "export"))
    probe_models = gpu_models(readable)
    rows = []
    for f, a in select(readable, stages, hosts, since):
        prov = {"stage": str(a["stage"]), "variant": str(a.get("variant", "")),
                "host": str(a.get("host", "")), "gpu_model": model_of(a, probe_models),
                "device_kind": str(a.get("device_kind", "")), "commit": str(a.get("git_commit", "")),
                "git_dirty": bool(a.get("git_dirty", True)),
                "config_hash": str(a.get("config_hash", "")), "time": str(a.get("finished_at", "")),
                "result_id": str(a.get("result_id", ""))}
        contents = results.list_contents(f)
        for name in contents["tables"]:
            rows += [{**prov, **r} for r in table_rows(results.read_table(f, name), name)]
        for name in contents["matrices"]:
            data, meta = results.read_matrix(f, name)
            rows += [{**prov, **r} for r in matrix_rows(np.asarray(data), meta, name)]
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.astype({"value": "float64", "sample": "int64", "git_dirty": "bool"})


def _atomic(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def write(df: pd.DataFrame, stem: str | os.PathLike, formats: Iterable[str] = FORMATS) -> list[Path]:
    """``df`` as ``stem``.parquet / .csv / .jsonl (atomic writes); returns the paths written."""
    stem = Path(stem)
    out = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise ExportError(f"unknown export format {fmt!r} (formats: {', '.join(FORMATS)}, prom)")
        path = stem.with_name(stem.name + FORMATS[fmt])
        if fmt == "parquet":
            out.append(_atomic(path, lambda p: df.to_parquet(p, engine="pyarrow", index=False)))
        elif fmt == "csv":
            out.append(_atomic(path, lambda p: df.to_csv(p, index=False)))
        else:
            # json.dumps writes floats with repr (exact round trip); pandas' to_json rounds.
            out.append(_atomic(path, lambda p: p.write_text("".join(
                json.dumps(r) + "\n" for r in df.to_dict("records")))))
    return out


_DTYPES = {"value": "float64", "sample": "int64", "git_dirty": "bool", "keys": "str",
           "commit": "str", "config_hash": "str", "result_id": "str", "time": "str"}


def read(path: str | os.PathLike) -> pd.DataFrame:
    """An export file (any format) back as the long table, with the export's column types."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path, engine="pyarrow")
        elif path.suffix == ".csv":
            df = pd.read_csv(path, dtype={c: str for c in COLUMNS if c not in _DTYPES or
                                          _DTYPES[c] == "str"}, keep_default_na=False)
        elif path.suffix == ".jsonl":
            with open(path) as fh:
                df = pd.DataFrame([json.loads(line) for line in fh if line.strip()],
                                  columns=COLUMNS)
        else:
            raise ExportError(f"{path}: not an export file (.parquet, .csv or .jsonl)")
    except (OSError, ValueError) as exc:
        if isinstance(exc, ExportError):
            raise
        raise ExportError(f"{path}: cannot read the export: {exc}") from exc
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ExportError(f"{path}: not a gpulab export (missing columns: {', '.join(missing)})")
    df = df[COLUMNS].copy()
    for c, t in _DTYPES.items():
        df[c] = df[c].astype(t)
    for c in COLUMNS:
        if c not in _DTYPES and df[c].dtype != object:
            df[c] = df[c].astype(str)
    return df
