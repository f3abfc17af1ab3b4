"""The training sets the training stage reads: digits and a synthetic tabular set, as HDF5."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from gpulab.data import datasets
from gpulab.data.api import write_training_set

log = logging.getLogger("gpulab.data")


def build(cfg: Mapping[str, Any], digits_path: str | Path, tabular_path: str | Path) -> None:
    """Write both training sets (each atomically) from the data stage's config section."""
    t = cfg.get("train", {})
    sets = [
        (digits_path, datasets.digits()),
        (tabular_path, datasets.tabular(int(t.get("tabular_rows", 4096)),
                                        int(t.get("tabular_features", 32)),
                                        int(t.get("tabular_classes", 4)),
                                        int(cfg.get("seed", 0)))),
    ]
    for path, ds in sets:
        write_training_set(path, ds.x, ds.y, ds.meta)
        log.info("data: training set %s: x %s float32, y %s int64, %d classes -> %s",
                 ds.name, list(ds.x.shape), list(ds.y.shape), ds.meta["num_classes"], path)
