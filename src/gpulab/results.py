"""HDF5 results: one file per job, with provenance, written atomically, read back as DataFrames.

Layout of a result file::

    /                 attrs: schema_version, stage, variant, host, device_kind, device_ids,
                             config (JSON), config_hash, git_commit, git_dirty, packages (JSON),
                             host_fingerprint (JSON), started_at, finished_at, result_id, conventions,
                             written_tables, written_matrices (JSON: what the writer put in, so a
                             reader can tell a whole file from an incomplete one)
    /tables/<name>/   one dataset per column (strings as UTF-8); attrs: columns, units (JSON)
    /matrices/<name>  2-D arrays (e.g. bandwidth GB/s, src x dst); attrs: unit, row/col labels

The file is written under a temporary name in the same folder and renamed into place, so an
interrupted job never leaves a half-written result where the pipeline would find it. A file damaged
afterwards (a full disk on a copy, a truncated transfer) is an error when it is read:
:class:`DamagedResult` names the file and the command that redoes it, and :func:`verify` checks a
file whole (``gpulab verify`` checks every result).
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


class DamagedResult(Exception):
    """A result file that cannot be read whole: truncated, corrupt, or missing what it recorded.

    Not an OSError on purpose: no reader's ``except OSError`` may swallow it silently.
    """

    def __init__(self, path: str | os.PathLike, why: str):
        self.path = Path(path)
        self.why = why
        self.stage, self.host, self.rule = origin(self.path)
        self.redo = redo_command(self.path)
        super().__init__(f"damaged result {self.path}: {why}; redo it: {self.redo}")


def origin(path: str | os.PathLike) -> tuple[str, str, str | None]:
    """(stage, host, Snakemake rule or None) of a result path, from the registry's path templates:
    the stage's job rule for its own result, None for a file another rule of the stage writes."""
    import re

    from gpulab import stages

    tail = Path(path).as_posix()
    for spec in stages.STAGES.values():
        # Extra results first: a stage's own template ({variant}.h5) would match them as well.
        for template, rule in [(t, None) for t in spec.extra_results] + [
                (spec.result, f"{spec.name}_variant" if spec.has_variants else spec.name)]:
            rx = re.escape(template.replace("{stage}", spec.name))
            rx = rx.replace(re.escape("{host}"), "(?P<host>[^/]+)").replace(
                re.escape("{variant}"), "[^/]+")
            m = re.search(r"(^|/)" + rx + "$", tail)
            if m:
                return spec.name, m.group("host"), rule
    return Path(path).parent.parent.name, Path(path).parent.name, None


def redo_command(path: str | os.PathLike) -> str:
    """The Snakemake command that rewrites the result at ``path``."""
    _, host, rule = origin(path)
    where = "" if host == host_name() else f" (on host {host})"
    if rule is None:  # not a stage rule's own output: force the rule that writes this file
        return f"snakemake --cores all --force {Path(path)}{where}"
    return f"snakemake --cores all --forcerun {rule}{where}"


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
    # What this file holds, recorded by its writer: a reader checks the file against it (verify).
    attrs.update(written_tables=json.dumps(sorted(result.tables)),
                 written_matrices=json.dumps(sorted(result.matrices)))
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


@contextlib.contextmanager
def _open(path: str | os.PathLike):
    """The result opened for reading; HDF5 failing on it (other than a missing file) is a
    :class:`DamagedResult` naming the file and how to redo it."""
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise DamagedResult(path, f"not a readable HDF5 file ({exc})") from None
    try:
        with f:
            yield f
    except OSError as exc:  # HDF5 failed reading a dataset or an attribute inside the file
        raise DamagedResult(path, f"HDF5 cannot read it ({exc})") from None


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    with _open(path) as f:
        return {k: _decode(v) for k, v in f.attrs.items()}


def read_table(path: str | os.PathLike, name: str) -> pd.DataFrame:
    """One table of a result as a DataFrame (units in ``df.attrs['units']``)."""
    with _open(path) as f:
        if f"tables/{name}" not in f:
            raise KeyError(f"{path}: no table {name!r} (has: {list(f.get('tables', {}).keys())})")
        g = f[f"tables/{name}"]
        cols = json.loads(g.attrs["columns"])
        data = {}
        for c in cols:
            if c not in g:
                raise DamagedResult(path, f"table {name!r} lacks its column {c!r}")
            ds = g[c]
            data[c] = ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()]
        if len({len(v) for v in data.values()}) > 1:
            raise DamagedResult(path, f"table {name!r} has columns of different lengths")
        df = pd.DataFrame(data, columns=cols)
        df.attrs["units"] = json.loads(g.attrs.get("units", "{}"))
        return df


def read_matrix(path: str | os.PathLike, name: str) -> tuple[np.ndarray, dict]:
    with _open(path) as f:
        ds = f[f"matrices/{name}"]
        data = ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()]
        return data, {k: _decode(v) for k, v in ds.attrs.items()}


def list_contents(path: str | os.PathLike) -> dict[str, list[str]]:
    with _open(path) as f:
        return {
            "tables": list(f["tables"].keys()) if "tables" in f else [],
            "matrices": list(f["matrices"].keys()) if "matrices" in f else [],
        }


def is_result(attrs: Mapping[str, Any]) -> bool:
    """A gpulab result (not another HDF5 file, e.g. the data stage's training sets)."""
    return "schema_version" in attrs and "stage" in attrs


def verify(path: str | os.PathLike) -> dict[str, Any] | None:
    """Read the result at ``path`` whole and return its root attrs; None when it is an HDF5 file
    but not a gpulab result. Raises :class:`DamagedResult` when any part cannot be read or a table
    or matrix its writer recorded is missing (files written before the record are read whole)."""
    attrs = read_attrs(path)
    if not is_result(attrs):
        return None
    have = list_contents(path)
    for kind, key in (("tables", "written_tables"), ("matrices", "written_matrices")):
        recorded = attrs.get(key)
        if recorded is None:
            continue
        missing = sorted(set(recorded) - set(have[kind]))
        if missing:
            raise DamagedResult(path, f"incomplete: its writer recorded {kind} {missing} that are "
                                      f"not in it")
    for name in have["tables"]:
        read_table(path, name)
    for name in have["matrices"]:
        read_matrix(path, name)
    return attrs


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


def with_attrs(paths: Iterable[str | os.PathLike], who: str = "gpulab",
               damaged: list[DamagedResult] | None = None, whole: bool = False):
    """(path, root attrs) of each gpulab result among ``paths``; other HDF5 files (e.g. the data
    stage's training sets, inputs rather than results) are skipped, logged.

    A damaged result raises :class:`DamagedResult`; a caller that carries on without it (the
    report, which marks the missing chapter) passes a ``damaged`` list to collect them instead.
    ``whole``: read every table and matrix (:func:`verify`), not just the root attrs.
    """
    import logging

    log = logging.getLogger(f"gpulab.{who}")
    for p in paths:
        try:
            a = verify(p) if whole else read_attrs(p)
        except DamagedResult as exc:
            if damaged is None:
                raise
            log.error("%s: %s", who, exc)
            damaged.append(exc)
            continue
        if a is None or not is_result(a):
            log.info("%s: %s is not a gpulab result (no stage/schema_version)", who, p)
            continue
        yield Path(p), a


def verify_all(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[DamagedResult]]:
    """(whole results, damaged results) among ``paths``; files that are no results are in neither."""
    damaged: list[DamagedResult] = []
    good = [p for p, _ in with_attrs(paths, "verify", damaged=damaged, whole=True)]
    return good, damaged


# <stage>/<host>/<variant>.h5: the deepest a result lies under the results folder.
RESULT_DEPTH = 3


def find_results(root: str | os.PathLike = "results", stage: str | None = None) -> list[Path]:
    """All result files under ``root`` (optionally of one stage), in a stable order.

    Results lie at ``<stage>/<host>.h5`` or ``<stage>/<host>/<variant>.h5``; HDF5 files deeper
    down are a stage's generated inputs (the data stage's datasets under ``data/<host>/files/``
    and ``data/<host>/train/``), not results, and are not read as such."""
    root = Path(root)
    pattern = f"{stage}/**/*.h5" if stage else "**/*.h5"
    return sorted(p for p in root.glob(pattern)
                  if not p.name.startswith(".") and len(p.relative_to(root).parts) <= RESULT_DEPTH)
