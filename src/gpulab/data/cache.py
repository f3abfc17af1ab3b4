"""A content-addressed cache of the generated datasets (``results/data/cache/``), reused across runs.

Generating the datasets is set-up, not measurement: scikit-learn's import alone is ~4 s of the
training-set job, which holds the whole host (issue 28). A dataset is stored as ``<name>-<key>.npz``
where the key hashes everything its bytes depend on: the generator, its arguments (seed, sizes),
the source of :mod:`gpulab.data.datasets` and numpy's version. Same key, same bytes: a different
seed, size or generator is a different file, so a stale entry is never read. Entries are written
atomically; an unreadable one is rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gpulab.data import datasets

log = logging.getLogger("gpulab.data")


def key(generator: str, params: dict[str, Any]) -> str:
    source = Path(datasets.__file__).read_bytes()
    blob = json.dumps({"generator": generator, "params": params, "numpy": np.__version__},
                      sort_keys=True).encode() + source
    return hashlib.sha256(blob).hexdigest()[:20]


def _load(path: Path) -> datasets.Dataset:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        return datasets.Dataset(meta["name"], z["x"], z["y"], meta)


def _store(path: Path, ds: datasets.Dataset) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
    try:
        np.savez(tmp, x=ds.x, y=ds.y, meta=np.array(json.dumps(ds.meta, sort_keys=True)))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def cached(cache_dir: Path | str | None, generator: str, **params) -> tuple[datasets.Dataset, bool]:
    """``datasets.<generator>(**params)``, from ``cache_dir`` where generated before. Returns the
    dataset and whether it came from the cache. ``cache_dir`` None: generate, cache nothing."""
    build: Callable[..., datasets.Dataset] = getattr(datasets, generator)
    if cache_dir is None:
        return build(**params), False
    path = Path(cache_dir) / f"{generator}-{key(generator, params)}.npz"
    if path.is_file():
        try:
            return _load(path), True
        except (OSError, ValueError, KeyError) as exc:  # a damaged entry: build it again
            log.warning("data: cache entry %s unreadable (%s); generating again", path, exc)
    ds = build(**params)
    _store(path, ds)
    return ds, False
