"""The load benchmark: every dataset written in every format, read back by every loader.

Per (dataset, format): the file is written once (write time, size on disk). Per loader:
``warmup`` untimed then ``repeats`` timed full loads (file -> validated torch tensors), the time to
the first batch (streaming loaders; a whole-file loader's first batch *is* its full load), one
more load for peak memory, and the exact round-trip check (loaded == written, bit for bit).

Conventions: MB = 10^6 bytes; file MB/s = bytes on disk / median load time; rows/s = samples /
median load time. Files are read right after being written, so the OS page cache is warm: these
are parse/decode costs, not disk reads.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from gpulab import timing
from gpulab.data import datasets, formats, loaders, memory
from gpulab.data.formats import Schema
from gpulab.outcomes import Check

log = logging.getLogger("gpulab.data")

# loaders that hand out batches as they go; the others parse the whole file before the first one
STREAMING = {"pandas-chunked", "json-lines", "h5py-chunked"}
TEXT_FORMATS = {"csv", "json", "jsonl"}


@dataclass
class Case:
    """One dataset to write and load."""

    kind: str  # real | tabular | images
    data: datasets.Dataset


def cases(cfg: Mapping[str, Any]) -> list[Case]:
    seed, classes = int(cfg.get("seed", 0)), int(cfg.get("classes", 10))
    out = [Case("real", datasets.digits())] if cfg.get("digits", True) else []
    for n in cfg.get("tabular_rows", [2000]):
        out.append(Case("tabular", datasets.tabular(int(n), int(cfg.get("tabular_features", 16)),
                                                    classes, seed)))
    c, h, w = cfg.get("image_shape", [3, 16, 16])
    for n in cfg.get("image_rows", []):
        out.append(Case("images", datasets.images(int(n), c, h, w, classes, seed)))
    return out


def formats_for(case: Case, cfg: Mapping[str, Any]) -> list[str]:
    """Configured formats; text ones only up to ``text_max_rows`` (they are 10-100x slower)."""
    cap = cfg.get("text_max_rows")
    return [f for f in cfg.get("formats", list(formats.FORMATS))
            if not (f in TEXT_FORMATS and cap is not None and case.data.rows > int(cap))]


def drain(it) -> tuple[torch.Tensor, torch.Tensor]:
    batches = list(it)
    if len(batches) == 1:
        return batches[0]
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def first_batch(it) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        return next(it)
    finally:
        it.close()  # releases the file (and pandas' reader) without reading the rest


def write_case(case: Case, fmt: str, folder: Path, cfg: Mapping[str, Any]) -> tuple[Path, dict]:
    path = folder / formats.file_name(case.data.name, fmt)
    opts = {"batch_rows": int(cfg.get("batch_rows", 256)), "gzip_level": int(cfg.get("gzip_level", 4))}
    t = timing.measure(lambda: formats.write(case.data, fmt, path, **opts), warmup=0, repeats=1)
    size = path.stat().st_size
    values = case.data.x.size + case.data.y.size
    return path, {"dataset": case.data.name, "kind": case.kind, "format": fmt, "rows": case.data.rows,
                  "file_bytes": size, "bytes_per_value": size / values, "write_s": t.median,
                  "write_MBps": size / 1e6 / t.median}


def load_case(case: Case | None, name: str, kind: str, path: Path, fmt: str, method: str,
              schema: Schema, cfg: Mapping[str, Any]) -> tuple[dict, Check]:
    """Time one loader on one file; returns (loads row, its round-trip check). ``case`` None: an
    external file, no reference (the check is not_applicable)."""
    fn = loaders.LOADERS[(fmt, method)]
    b = int(cfg.get("batch_rows", 256))
    warmup, repeats = int(cfg.get("warmup", 1)), int(cfg.get("repeats", 3))
    full = timing.measure(lambda: drain(fn(path, schema, b)), warmup=warmup, repeats=repeats)
    if method in STREAMING:
        first = timing.measure(lambda: first_batch(fn(path, schema, b)), warmup=warmup, repeats=repeats)
    else:
        first = full
    peak, mem_method = memory.peak_increase(lambda: drain(fn(path, schema, b)))
    x, y = drain(fn(path, schema, b))
    size, rows = path.stat().st_size, len(y)
    row = {"dataset": name, "kind": kind, "format": fmt, "method": method,
           "streaming": method in STREAMING, "rows": rows,
           "values_per_row": int(x[0].numel()) if rows else 0, "file_bytes": size,
           "tensor_bytes": x.numel() * x.element_size() + y.numel() * y.element_size(),
           **full.as_dict("load_s"), "file_MBps": size / 1e6 / full.median,
           "rows_per_s": rows / full.median,
           "ttfb_s_median": first.median, "ttfb_s_min": first.min, "ttfb_s_max": first.max,
           "first_batch_rows": min(b, rows) if method in STREAMING else rows,
           "peak_mem_bytes": peak, "peak_mem_method": mem_method}
    what = f"{name} {fmt}/{method}"
    if case is None:
        # Nothing to compare with: not a pass. The file was validated (columns, numbers, labels).
        check = Check.of("round trip", what, None, note="external file: no reference to compare "
                                                         "with; validated (columns, numbers, labels) only")
    else:
        ok_x = torch.equal(x, torch.from_numpy(case.data.x))
        ok_y = torch.equal(y, torch.from_numpy(case.data.y))
        check = Check.of("round trip", what, ok_x and ok_y,
                         note="x and y equal to what was written, bit for bit" if ok_x and ok_y else
                         f"MISMATCH: x equal {ok_x}, y equal {ok_y}")
    row["round_trip"] = check.verdict
    return row, check


# Columns the shared units table (gpulab.outcomes.UNITS) does not name, or names differently here.
LOAD_UNITS = {"rows": "samples", "values_per_row": "values", "file_bytes": "B", "tensor_bytes": "B",
              "load_s_median": "s", "load_s_min": "s", "load_s_max": "s", "load_s_mean": "s",
              "load_s_stdev": "s", "repeats": "count", "file_MBps": "MB/s (10^6 B, file size)",
              "rows_per_s": "samples/s", "ttfb_s_median": "s", "ttfb_s_min": "s",
              "ttfb_s_max": "s", "first_batch_rows": "samples", "peak_mem_bytes": "B",
              "streaming": "bool", "round_trip": "verdict"}
WRITE_UNITS = {"rows": "samples", "file_bytes": "B", "bytes_per_value": "B/value", "write_s": "s",
               "write_MBps": "MB/s (10^6 B, file size)"}
