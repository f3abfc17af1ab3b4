"""The training sets the training stage reads: digits and a synthetic tabular set, as HDF5."""
from __future__ import annotations

import logging
from pathlib import Path

from gpulab.data import cache
from gpulab.data.api import write_training_set
from gpulab.data.settings import Settings

log = logging.getLogger("gpulab.data")


def build(cfg: Settings, digits_path: str | Path, tabular_path: str | Path,
          cache_dir: str | Path | None = None) -> None:
    """Write both training sets (each atomically) from the data stage's config section, taking the
    generated data from the dataset cache (gpulab.data.cache) where ``cache_dir`` is given."""
    t = cfg.train
    tab = {"rows": t.tabular_rows, "features": t.tabular_features, "classes": t.tabular_classes,
           "seed": cfg.seed}
    sets = [(digits_path, "digits", {}), (tabular_path, "tabular", tab)]
    for path, generator, params in sets:
        ds, hit = cache.cached(cache_dir, generator, **params)
        write_training_set(path, ds.x, ds.y, ds.meta)
        log.info("data: training set %s (%s): x %s float32, y %s int64, %d classes -> %s",
                 ds.name, "from the cache" if hit else "generated", list(ds.x.shape),
                 list(ds.y.shape), ds.meta["num_classes"], path)
