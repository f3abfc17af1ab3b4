"""Loaders: CSV, JSON and HDF5 files into torch tensors ``x`` float32 [N, ...], ``y`` int64 [N].

Every loader is a generator of ``(x, y)`` batches, so the benchmark times the first batch and the
whole pass with the same code; a "whole" loader yields a single batch. Every loader validates what
it read (all expected columns present, numbers where numbers belong, no missing values, labels
whole and not NaN) and raises :class:`DataError` naming the file and the line and/or key:

* CSV: ``line`` is the 1-based line in the file (the header is line 1), ``key`` the column;
* JSON records: ``key`` is ``[i].column`` (record ``i``); parse errors give the line;
* JSON lines: ``line`` is the line, ``key`` the field;
* HDF5: ``key`` is the dataset, with the sample index as ``x[i]`` / ``y[i]``.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import pandas as pd

from gpulab import lifetime
from gpulab.data.h5files import open_h5, require_datasets
from gpulab.data.errors import DataError
from gpulab.data.formats import Schema

if TYPE_CHECKING:
    import torch

    from gpulab.data.settings import Settings

# torch is imported where tensors are made: the Snakefile imports this module at parse time (to
# check the user's input files), and every Snakemake start would pay ~2 s for torch.
Batch = tuple["torch.Tensor", "torch.Tensor"]
# where(row, column) -> DataError keyword arguments (line=..., key=...) locating a value
Where = Callable[[int, str], dict]


# ---- validation shared by every format -------------------------------------------------------

def to_tensors(path, x: np.ndarray, y: np.ndarray, schema: Schema, where: Where) -> Batch:
    """Check decoded arrays and convert: NaN features or labels, fractional labels are errors."""
    x = np.asarray(x)
    y = np.asarray(y)
    if x.dtype.kind not in "fiu":
        raise DataError(path, f"features have dtype {x.dtype}; need numbers", **where(0, schema.columns[0]))
    if y.dtype.kind not in "fiu":
        raise DataError(path, f"labels have dtype {y.dtype}; need integers", **where(0, schema.label))
    # One summing pass finds "any NaN?" without a temporary mask the size of the data; only then
    # look for where (an infinity also makes the sum non-finite, but is not an error).
    if x.dtype.kind == "f" and x.size and not np.isfinite(x.sum(dtype=np.float64)):
        flat = x.reshape(len(x), -1)
        bad = np.isnan(flat)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise DataError(path, "missing value (empty, null or NaN feature)",
                            **where(int(r), schema.columns[int(c)]))
    if y.dtype.kind == "f":
        if np.isnan(y).any():
            r = int(np.flatnonzero(np.isnan(y))[0])
            raise DataError(path, "label is NaN (or missing)", **where(r, schema.label))
        frac = y != np.round(y)
        if frac.any():
            r = int(np.flatnonzero(frac)[0])
            raise DataError(path, f"label {y[r]!r} is not a whole number", **where(r, schema.label))
    if (y < 0).any():
        r = int(np.flatnonzero(y < 0)[0])
        raise DataError(path, f"label {y[r]} is negative", **where(r, schema.label))
    xt = _tensor(x, np.float32).reshape(len(x), *schema.sample_shape)
    return xt, _tensor(y, np.int64)


def _tensor(a: np.ndarray, dtype) -> torch.Tensor:
    import torch

    a = np.ascontiguousarray(a, dtype=dtype)
    # pandas hands out read-only views (copy-on-write); torch wants to own writable memory
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def frame_to_tensors(path, df: pd.DataFrame, schema: Schema, where: Where,
                     text_numbers: bool = False) -> Batch:
    """A DataFrame (from CSV or JSON) to tensors: missing columns and non-numbers named first.

    ``text_numbers``: a string holding a number is fine (CSV); in JSON it is the wrong type.
    """
    missing = [c for c in (*schema.columns, schema.label) if c not in df.columns]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(path, f"missing column{more}", **where(-1, missing[0]))
    cols = list(schema.columns)
    for c in (*cols, schema.label):
        if df[c].dtype.kind not in "fiu":  # object (strings, bools, nested values) or bool
            r = _first_non_number(df[c], text_numbers)
            if r is not None:
                raise DataError(path, f"value {df[c].iloc[r]!r} is not a number (wrong dtype)",
                                **where(r, c))
    x = df[cols].apply(pd.to_numeric) if (df[cols].dtypes == object).any() else df[cols]
    y = pd.to_numeric(df[schema.label])
    return to_tensors(path, x.to_numpy(), y.to_numpy(), schema, where)


def _first_non_number(s: pd.Series, text_numbers: bool) -> int | None:
    """Row of the first value that is neither a number nor missing (slow; error path only)."""
    for r, v in enumerate(s.to_numpy()):
        if v is None or (isinstance(v, float) and v != v):
            continue  # missing: reported as such by to_tensors
        if isinstance(v, (bool, np.bool_)):
            return r
        if isinstance(v, (int, float, np.integer, np.floating)):
            continue
        if text_numbers and isinstance(v, str) and _is_float(v):
            continue
        return r
    return None


# ---- CSV ------------------------------------------------------------------------------------

def _csv_where(offset: int = 0) -> Where:
    # data row r (0-based) of a chunk starting at data row `offset` is on line offset + r + 2
    return lambda r, c: {"line": 1 if r < 0 else offset + r + 2, "key": c}


def _pandas_errors(path: Path, exc: Exception) -> DataError:
    m = re.search(r"line (\d+)", str(exc))
    return DataError(path, f"malformed CSV ({str(exc).strip()})", line=int(m.group(1)) if m else None)


def _read_csv(path: Path, **kw):
    # skip_blank_lines=False keeps row r on line r + 2, so errors can name the line
    try:
        with lifetime.sigterm_deferred():  # pandas' parallel reader must not be stopped mid-call
            return pd.read_csv(path, skip_blank_lines=False, **kw)
    except pd.errors.EmptyDataError:
        raise DataError(path, "empty file (no header)", line=1) from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise _pandas_errors(path, exc) from None


def csv_pandas(path: Path, schema: Schema, batch_rows: int) -> Iterator[Batch]:
    """The whole file with pandas' C parser."""
    yield frame_to_tensors(path, _read_csv(path), schema, _csv_where(), text_numbers=True)


def csv_pandas_chunked(path: Path, schema: Schema, batch_rows: int) -> Iterator[Batch]:
    """``batch_rows`` rows at a time with pandas' C parser (a stream: first batch early)."""
    offset = 0
    reader = _read_csv(path, chunksize=batch_rows)
    try:
        for df in reader:
            yield frame_to_tensors(path, df, schema, _csv_where(offset), text_numbers=True)
            offset += len(df)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise _pandas_errors(path, exc) from None
    finally:
        reader.close()


def csv_stdlib(path: Path, schema: Schema, batch_rows: int) -> Iterator[Batch]:
    """Python's csv module: the slow, dependency-free reference (exact line numbers)."""
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise DataError(path, "empty file (no header)", line=1)
        pos = {c: i for i, c in enumerate(header)}
        for c in (*schema.columns, schema.label):
            if c not in pos:
                raise DataError(path, "missing column", line=1, key=c)
        want = [pos[c] for c in schema.columns]
        ycol = pos[schema.label]
        xs, ys = [], []
        for row in reader:
            if len(row) != len(header):
                raise DataError(path, f"has {len(row)} fields, the header has {len(header)}",
                                line=reader.line_num)
            try:
                xs.append([float(row[i]) for i in want])
            except ValueError:
                i = next(i for i in want if not _is_float(row[i]))
                problem = (f"value {row[i]!r} is not a number" if row[i].strip()
                           else "missing value (empty, null or NaN feature)")
                raise DataError(path, problem, line=reader.line_num, key=header[i]) from None
            ys.append(_label(path, row[ycol], reader.line_num, schema.label))
    x = np.array(xs, dtype=np.float64).reshape(len(xs), -1)
    yield to_tensors(path, x, np.array(ys, dtype=np.int64), schema,
                     lambda r, c: {"line": r + 2, "key": c})


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _label(path, s: str, line: int, key: str) -> int:
    if not s.strip():
        raise DataError(path, "label is NaN (or missing)", line=line, key=key)
    try:
        v = float(s)
    except ValueError:
        raise DataError(path, f"label {s!r} is not a number", line=line, key=key) from None
    if v != v:
        raise DataError(path, "label is NaN (or missing)", line=line, key=key)
    if v != int(v):
        raise DataError(path, f"label {s!r} is not a whole number", line=line, key=key)
    return int(v)


# ---- JSON -----------------------------------------------------------------------------------

def _decode_error(path, exc: json.JSONDecodeError) -> DataError:
    # an error on the last line of the text means it stopped mid-value: a cut-off file
    what = "truncated JSON" if "\n" not in exc.doc[exc.pos:].rstrip() else "malformed JSON"
    return DataError(path, f"{what}: {exc.msg} (column {exc.colno})", line=exc.lineno)


def _records_frame(path, records: list, where: Where) -> pd.DataFrame:
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise DataError(path, f"record is a {type(r).__name__}, not an object", **where(i, ""))
    return pd.DataFrame.from_records(records)


def json_records(path: Path, schema: Schema, batch_rows: int) -> Iterator[Batch]:
    """A JSON array of objects with the json module (the whole document must be parsed first)."""
    doc = json_records_raw(path)

    def where(r, c):
        return {"key": c if r < 0 else f"[{r}].{c}" if c else f"[{r}]"}

    yield frame_to_tensors(path, _records_frame(path, doc, where), schema, where)


def json_lines(path: Path, schema: Schema, batch_rows: int) -> Iterator[Batch]:
    """JSON lines with the json module, ``batch_rows`` records at a time (blank lines skipped)."""
    with open(path, encoding="utf-8") as fh:
        records, lines, seen = [], [], 0
        for n, text in enumerate(fh, 1):
            if not text.strip():
                continue
            seen += 1
            try:
                records.append(json.loads(text))
            except json.JSONDecodeError as exc:
                raise DataError(path, f"{_decode_error(path, exc).problem}", line=n) from None
            lines.append(n)
            if len(records) == batch_rows:
                yield _jsonl_batch(path, records, lines, schema)
                records, lines = [], []
    if records:
        yield _jsonl_batch(path, records, lines, schema)
    elif not seen:
        raise DataError(path, "empty file (no records)", line=1)


def _jsonl_batch(path, records, lines, schema) -> Batch:
    def where(r, c):
        return {"line": lines[max(r, 0)], "key": c or None}

    return frame_to_tensors(path, _records_frame(path, records, where), schema, where)


# ---- HDF5 -----------------------------------------------------------------------------------

def _h5_datasets(f, path, schema: Schema):
    xd, yd = require_datasets(f, path, schema.x_key, schema.y_key)
    if tuple(xd.shape[1:]) != tuple(schema.sample_shape):
        raise DataError(path, f"samples have shape {tuple(xd.shape[1:])}, expected "
                        f"{tuple(schema.sample_shape)}", key=schema.x_key)
    if yd.ndim != 1 or len(yd) != len(xd):
        raise DataError(path, f"labels have shape {yd.shape}; need [{len(xd)}]", key=schema.y_key)
    return xd, yd


def _h5_where(schema: Schema, offset: int) -> Where:
    def where(r, c):
        key = schema.y_key if c == schema.label else schema.x_key
        return {"key": f"{key}[{offset + max(r, 0)}]"}
    return where


def _read(path, ds, sel, name):
    try:
        return ds[sel]
    except OSError as exc:  # a damaged chunk: HDF5 cannot read or decompress it
        raise DataError(path, f"corrupt data, cannot read ({exc})", key=name) from None


def h5_whole(path: Path, schema: Schema, batch_rows: int) -> Iterator[Batch]:
    """Both datasets in one read each with h5py."""
    with open_h5(path) as f:
        xd, yd = _h5_datasets(f, path, schema)
        x, y = _read(path, xd, (), schema.x_key), _read(path, yd, (), schema.y_key)
    yield to_tensors(path, x, y, schema, _h5_where(schema, 0))


def h5_chunked(path: Path, schema: Schema, batch_rows: int) -> Iterator[Batch]:
    """``batch_rows`` samples per read (one HDF5 chunk when the file was written with the same)."""
    with open_h5(path) as f:
        xd, yd = _h5_datasets(f, path, schema)
        for start in range(0, len(xd), batch_rows):
            sl = slice(start, start + batch_rows)
            yield to_tensors(path, _read(path, xd, sl, schema.x_key),
                             _read(path, yd, sl, schema.y_key), schema, _h5_where(schema, start))


# (format, method) -> loader; the benchmark runs every pair whose format it wrote
LOADERS: dict[tuple[str, str], Callable[[Path, Schema, int], Iterator[Batch]]] = {
    ("csv", "pandas"): csv_pandas,
    ("csv", "pandas-chunked"): csv_pandas_chunked,
    ("csv", "csv-module"): csv_stdlib,
    ("json", "json"): json_records,
    ("jsonl", "json-lines"): json_lines,
}
for _fmt in ("h5", "h5-gzip", "h5-lzf"):
    LOADERS[(_fmt, "h5py-whole")] = h5_whole
    LOADERS[(_fmt, "h5py-chunked")] = h5_chunked


def load(path: str | Path, fmt: str, schema: Schema, method: str | None = None,
         batch_rows: int = 256) -> Batch:
    """The whole file as ``(x, y)`` tensors (the format's first loader unless ``method`` given)."""
    path = Path(path)
    methods = [m for (f, m) in LOADERS if f == fmt]
    if not methods:
        raise ValueError(f"unknown data format {fmt!r}")
    method = method or methods[0]
    if (fmt, method) not in LOADERS:
        raise ValueError(f"format {fmt!r} has no loader {method!r} (has: {', '.join(methods)})")
    if not path.exists():
        raise DataError(path, "file does not exist")
    batches = list(LOADERS[(fmt, method)](path, schema, batch_rows))
    if len(batches) == 1:
        return batches[0]
    import torch

    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


# ---- files from elsewhere: format from the suffix, schema from the file -----------------------

SUFFIXES = {".csv": "csv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl",
            ".h5": "h5", ".hdf5": "h5"}


def format_of(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(path, f"unknown file type {suffix!r}; known: {', '.join(SUFFIXES)}")
    return SUFFIXES[suffix]


def infer_schema(path: str | Path, fmt: str, label: str = "label") -> Schema:
    """Feature columns = every column but ``label``, in file order (HDF5: the shape of ``x``)."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, "file does not exist")
    if fmt.startswith("h5"):
        with open_h5(path) as f:
            shape = tuple(int(s) for s in require_datasets(f, path, "x")[0].shape[1:])
        n = int(np.prod(shape, dtype=np.int64))
        return Schema(tuple(f"x{i}" for i in range(n)), shape, label)
    if fmt == "csv":
        with open(path, newline="") as fh:
            header = next(csv.reader(fh), None)
        if not header:
            raise DataError(path, "empty file (no header)", line=1)
        keys, where = header, {"line": 1}
    else:
        first = next(iter(json_records_raw(path) if fmt == "json" else _first_jsonl(path)), None)
        if not isinstance(first, dict):
            raise DataError(path, "no records (or the first is not an object)", line=1)
        keys, where = list(first), {}
    if label not in keys:
        raise DataError(path, f"no label column in the {'header' if where else 'first record'} "
                        f"(has: {', '.join(map(str, keys[:8]))}{', ...' if len(keys) > 8 else ''})",
                        key=label, **where)
    cols = tuple(k for k in keys if k != label)
    return Schema(cols, (len(cols),), label)


def json_records_raw(path: Path) -> list:
    try:
        with open(path, "rb") as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as exc:
        raise _decode_error(path, exc) from None
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not UTF-8 text ({exc})") from None
    if not isinstance(doc, list):
        raise DataError(path, f"top level is a {type(doc).__name__}; need an array of records")
    return doc


def _first_jsonl(path: Path) -> list:
    with open(path, encoding="utf-8") as fh:
        for n, text in enumerate(fh, 1):
            if text.strip():
                try:
                    return [json.loads(text)]
                except json.JSONDecodeError as exc:
                    raise DataError(path, _decode_error(path, exc).problem, line=n) from None
    return []


def external_inputs(cfg: Settings) -> list[tuple[Path, str, Schema]]:
    """Files named in config ``inputs``: validated up front, so a bad one fails before any work."""
    out = []
    for item in cfg.inputs:
        path = Path(item.path)
        fmt = item.format or format_of(path)
        out.append((path, fmt, infer_schema(path, fmt, item.label)))
    return out
