"""Writers: a dataset to CSV, JSON (records, JSON lines) and chunked HDF5 (plain or compressed).

Text formats store the flat layout: one row per sample, feature columns ``f0..`` (``p0..`` for
images) then ``label``. Floats are written with 9 significant digits, which is exactly enough to
get every float32 back bit for bit. JSON is written one record per line (records JSON: ``[`` on
line 1, record ``i`` on line ``i + 2``), so parse errors point at a record.

HDF5 files keep the sample shape: ``x`` float32 [N, ...] and ``y`` int64 [N], chunked by
``batch_rows`` samples (the unit the chunked loader reads), optionally with the shuffle filter and
gzip or LZF compression. They get the ``.hdf5`` suffix: ``.h5`` under ``results/`` means a gpulab
result file to the report.

Every writer writes under a temporary name and renames, so a failed write leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import io
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import h5py

from gpulab.data.datasets import LABEL, Dataset

FLOAT_FORMAT = "%.9g"  # 9 significant digits round-trip any float32 exactly

# format name -> (file suffix, HDF5 compression or None, is HDF5)
FORMATS: dict[str, tuple[str, str | None, bool]] = {
    "csv": (".csv", None, False),
    "json": (".json", None, False),
    "jsonl": (".jsonl", None, False),
    "h5": (".hdf5", None, True),
    "h5-gzip": (".gzip.hdf5", "gzip", True),
    "h5-lzf": (".lzf.hdf5", "lzf", True),
}


@dataclass(frozen=True)
class Schema:
    """What a loader expects: feature columns (flat layout), the label column, the sample shape."""

    columns: tuple[str, ...]
    sample_shape: tuple[int, ...]
    label: str = LABEL
    x_key: str = "x"
    y_key: str = "y"

    @classmethod
    def of(cls, ds: Dataset) -> "Schema":
        return cls(tuple(ds.columns), ds.sample_shape)


def is_hdf5(fmt: str) -> bool:
    return FORMATS[fmt][2]


def file_name(dataset: str, fmt: str) -> str:
    return dataset + FORMATS[fmt][0]


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; renamed onto it when the block succeeds, removed if not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def csv_text(ds: Dataset) -> str:
    import pandas as pd

    df = pd.DataFrame(ds.x.reshape(ds.rows, -1), columns=ds.columns)
    df[LABEL] = ds.y
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")
    return buf.getvalue()


def json_lines(ds: Dataset) -> list[str]:
    """One JSON object per sample, the numbers exactly as in the CSV (formatted once, by pandas)."""
    rows = csv_text(ds).splitlines()[1:]
    keys = [*ds.columns, LABEL]
    template = "{" + ", ".join(f'"{k}": %s' for k in keys) + "}"
    return [template % tuple(r.split(",")) for r in rows]


def write(ds: Dataset, fmt: str, path: str | os.PathLike, *, batch_rows: int = 256,
          gzip_level: int = 4) -> Path:
    """Write ``ds`` to ``path`` in format ``fmt`` (a key of FORMATS), atomically."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown data format {fmt!r}; known: {', '.join(FORMATS)}")
    path = Path(path)
    with atomic_path(path) as tmp:
        if fmt == "csv":
            tmp.write_text(csv_text(ds))
        elif fmt == "json":
            tmp.write_text("[\n" + ",\n".join(json_lines(ds)) + "\n]\n")
        elif fmt == "jsonl":
            tmp.write_text("\n".join(json_lines(ds)) + "\n")
        else:
            _write_h5(ds, tmp, FORMATS[fmt][1], batch_rows, gzip_level)
    return path


def _write_h5(ds: Dataset, path: Path, compression: str | None, batch_rows: int,
              gzip_level: int) -> None:
    rows = max(1, min(batch_rows, ds.rows))
    opts: dict = {}
    if compression == "gzip":
        opts = {"compression": "gzip", "compression_opts": gzip_level, "shuffle": True}
    elif compression == "lzf":
        opts = {"compression": "lzf", "shuffle": True}
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=ds.x, chunks=(rows, *ds.sample_shape), **opts)
        f.create_dataset("y", data=ds.y, chunks=(rows,), **opts)
        f.attrs["name"] = ds.name
        f.attrs["columns"] = ",".join(ds.columns)
