"""The training sets the training stage reads: digits and a synthetic tabular set, as HDF5."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from gpulab.data import cache
from gpulab.data.api import write_training_set

log = logging.getLogger("gpulab.data")


def build(cfg: Mapping[str, Any], digits_path: str | Path, tabular_path: str | Path,
          cache_dir: str | Path | None = None) -> None:
    """Write both training sets (each atomically) from the data stage's config section, taking the
    generated data from the dataset cache (gpulab.data.cache) where ``cache_dir`` is given."""
    t = cfg.get("train", {})
    tab = {"rows": int(t.get("tabular_rows", 4096)), "features": int(t.get("tabular_features", 32)),
           "classes": int(t.get("tabular_classes", 4)), "seed": int(cfg.get("seed", 0))}
    sets = [(digits_path, "digits", {}), (tabular_path, "tabular", tab)]
    for path, generator, params in sets:
        ds, hit = cache.cached(cache_dir, generator, **params)
        write_training_set(path, ds.x, ds.y, ds.meta)
        log.info("data: training set %s (%s): x %s float32, y %s int64, %d classes -> %s",
                 ds.name, "from the cache" if hit else "generated", list(ds.x.shape),
                 list(ds.y.shape), ds.meta["num_classes"], path)
