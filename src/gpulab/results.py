"""HDF5 results: one file per job, with provenance, written atomically, read back as DataFrames.

Layout of a result file::

    /                 attrs: schema_version, stage, variant, host, device_kind, device_ids,
                             config (JSON), config_hash, git_commit, git_dirty, packages (JSON),
                             host_fingerprint (JSON), started_at, finished_at, result_id, conventions
    /tables/<name>/   one dataset per column (strings as UTF-8); attrs: columns, units (JSON)
    /matrices/<name>  2-D arrays (e.g. bandwidth GB/s, src x dst); attrs: unit, row/col labels

The file is written under a temporary name in the same folder and renamed into place, so an
interrupted job never leaves a half-written result where the pipeline would find it.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

import h5py
import numpy as np
import pandas as pd

SCHEMA_VERSION = 1
TRACKED_PACKAGES = (
    "gpulab", "torch", "cupy-cuda12x", "cupy-cuda13x", "numpy", "pandas", "h5py", "snakemake",
    "seaborn", "nvidia-ml-py", "scikit-learn",
)
REPO_ROOT = Path(__file__).resolve().parents[2]


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def host_name() -> str:
    """Host label used in result paths: $GPULAB_HOST, else the short hostname."""
    name = os.environ.get("GPULAB_HOST") or socket.gethostname().split(".")[0]
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "host"


def config_hash(config: Any) -> str:
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def git_state(root: Path = REPO_ROOT) -> tuple[str, bool]:
    """(commit, dirty) of the source tree, or ('unknown', True) outside a git checkout.

    A copy of the tree without .git (a GPU node, a container) can pass the state in through
    $GPULAB_GIT_COMMIT and $GPULAB_GIT_DIRTY (0/1).
    """
    if os.environ.get("GPULAB_GIT_COMMIT"):
        return os.environ["GPULAB_GIT_COMMIT"], os.environ.get("GPULAB_GIT_DIRTY", "1") != "0"
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        return commit, bool(status)
    except (subprocess.SubprocessError, OSError):
        return "unknown", True


def package_versions(names: Iterable[str] = TRACKED_PACKAGES, import_torch: bool = True
                     ) -> dict[str, str]:
    """Installed versions; torch's CUDA and NCCL builds where torch is (or, with ``import_torch``,
    can be) loaded. A result writer passes False: a job that did its work without torch (a CuPy
    kernel job) would otherwise spend seconds importing it just to say which CUDA it was built for."""
    out = {}
    for n in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[n] = metadata.version(n)
    with contextlib.suppress(Exception):
        if not import_torch and "torch" not in sys.modules:
            raise ImportError("torch not loaded by this job")
        import torch

        out["torch"] = torch.__version__
        out["torch.cuda"] = str(torch.version.cuda)
        if torch.cuda.is_available():
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    out["python"] = platform.python_version()
    return out


def host_fingerprint() -> dict[str, Any]:
    import psutil

    return {
        "host": host_name(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "logical_cpus": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


@dataclass
class Result:
    """A result in memory: what a stage produced and where it came from."""

    stage: str
    variant: str
    config: Mapping[str, Any]
    device_kind: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    matrices: dict[str, tuple[np.ndarray, dict]] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    started_at: str = field(default_factory=now_iso)

    def add_table(self, name: str, df: pd.DataFrame, units: Mapping[str, str] | None = None):
        df = df.reset_index(drop=True)
        df.attrs["units"] = dict(units or {})
        self.tables[name] = df

    def add_matrix(self, name: str, values, unit: str, rows=None, cols=None, **attrs):
        a = np.asarray(values)
        meta = {"unit": unit, **attrs}
        if rows is not None:
            meta["rows"] = [str(r) for r in rows]
        if cols is not None:
            meta["cols"] = [str(c) for c in cols]
        self.matrices[name] = (a, meta)


def _write_table(group: h5py.Group, df: pd.DataFrame) -> None:
    group.attrs["columns"] = json.dumps([str(c) for c in df.columns])
    group.attrs["units"] = json.dumps(df.attrs.get("units", {}))
    for col in df.columns:
        s = df[col]
        if s.dtype == object or pd.api.types.is_string_dtype(s) or isinstance(
            s.dtype, pd.CategoricalDtype
        ):
            data = np.array(["" if pd.isna(v) else str(v) for v in s], dtype=object)
            group.create_dataset(str(col), data=data, dtype=h5py.string_dtype("utf-8"))
        elif pd.api.types.is_bool_dtype(s):
            group.create_dataset(str(col), data=s.to_numpy(dtype=bool))
        else:
            group.create_dataset(str(col), data=s.to_numpy())


def _json_attr(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool, np.integer, np.floating, np.bool_)):
        return v
    return json.dumps(v, default=str)


def write(result: Result, path: str | os.PathLike) -> Path:
    """Write ``result`` to ``path`` atomically, adding provenance attributes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    commit, dirty = git_state()
    attrs = {
        "schema_version": SCHEMA_VERSION,
        "stage": result.stage,
        "variant": result.variant,
        "host": host_name(),
        "device_kind": result.device_kind,
        "device_ids": os.environ.get("GPULAB_DEVICE_IDS", ""),
        "config": json.dumps(result.config, sort_keys=True, default=str),
        "config_hash": config_hash(result.config),
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": json.dumps(package_versions(import_torch=False)),
        "host_fingerprint": json.dumps(host_fingerprint()),
        "started_at": result.started_at,
        "finished_at": now_iso(),
        "result_id": uuid.uuid4().hex,
    }
    attrs.update({k: _json_attr(v) for k, v in result.attrs.items()})
    # The overall verdict is derived from the checks and bars, never set by a stage.
    from gpulab import outcomes

    ov = outcomes.overall(result.tables)
    attrs.update(verdict=ov["verdict"], verdict_counts=json.dumps(ov["counts"]),
                 verdict_summary=ov["summary"])
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in attrs.items():
                f.attrs[k] = v
            tg = f.create_group("tables")
            for name, df in result.tables.items():
                _write_table(tg.create_group(name), df)
            mg = f.create_group("matrices")
            for name, (a, meta) in result.matrices.items():
                if a.dtype.kind in "UO":
                    ds = mg.create_dataset(name, data=a.astype(object), dtype=h5py.string_dtype())
                else:
                    ds = mg.create_dataset(name, data=a)
                for k, v in meta.items():
                    ds.attrs[k] = _json_attr(v)
            f.flush()
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write a text file (summary, report) via a temporary name and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def _decode(v: Any) -> Any:
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str) and v[:1] in "[{":
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    with h5py.File(path, "r") as f:
        return {k: _decode(v) for k, v in f.attrs.items()}


def read_table(path: str | os.PathLike, name: str) -> pd.DataFrame:
    """One table of a result as a DataFrame (units in ``df.attrs['units']``)."""
    with h5py.File(path, "r") as f:
        if f"tables/{name}" not in f:
            raise KeyError(f"{path}: no table {name!r} (has: {list(f.get('tables', {}).keys())})")
        g = f[f"tables/{name}"]
        cols = json.loads(g.attrs["columns"])
        data = {}
        for c in cols:
            ds = g[c]
            data[c] = ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()]
        df = pd.DataFrame(data, columns=cols)
        df.attrs["units"] = json.loads(g.attrs.get("units", "{}"))
        return df


def read_matrix(path: str | os.PathLike, name: str) -> tuple[np.ndarray, dict]:
    with h5py.File(path, "r") as f:
        ds = f[f"matrices/{name}"]
        data = ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()]
        return data, {k: _decode(v) for k, v in ds.attrs.items()}


def list_contents(path: str | os.PathLike) -> dict[str, list[str]]:
    with h5py.File(path, "r") as f:
        return {
            "tables": list(f["tables"].keys()) if "tables" in f else [],
            "matrices": list(f["matrices"].keys()) if "matrices" in f else [],
        }


def collect(paths: Iterable[str | os.PathLike], table: str) -> pd.DataFrame:
    """Concatenate one table across result files, adding host/stage/variant/device_kind columns."""
    frames = []
    for p in paths:
        if table not in list_contents(p)["tables"]:
            continue
        a = read_attrs(p)
        df = read_table(p, table)
        for k in ("host", "stage", "variant", "device_kind", "result_id"):
            if k not in df.columns:
                df.insert(0, k, a.get(k, ""))
        frames.append(df)
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    out.attrs["units"] = frames[0].attrs.get("units", {})
    return out


def with_attrs(paths: Iterable[str | os.PathLike], who: str = "gpulab"):
    """(path, root attrs) of each gpulab result among ``paths``; unreadable files and other HDF5
    files (e.g. the data stage's training sets, inputs rather than results) are skipped, logged."""
    import logging

    log = logging.getLogger(f"gpulab.{who}")
    for p in paths:
        try:
            a = read_attrs(p)
        except OSError as exc:
            log.warning("%s: skipping unreadable result %s: %s", who, p, exc)
            continue
        if "schema_version" not in a or "stage" not in a:
            log.info("%s: %s is not a gpulab result (no stage/schema_version)", who, p)
            continue
        yield Path(p), a


def find_results(root: str | os.PathLike = "results", stage: str | None = None) -> list[Path]:
    """All result files under ``root`` (optionally of one stage), in a stable order."""
    root = Path(root)
    pattern = f"{stage}/**/*.h5" if stage else "**/*.h5"
    return sorted(p for p in root.glob(pattern) if not p.name.startswith("."))
