"""Data loading stage: datasets, writers and loaders (CSV, JSON, HDF5), the HDF5 training-set
interface used by the training stage, and the load benchmark.

``gpulab.data.api`` is the public interface other stages import (``H5Dataset``,
``write_training_set``, ``read_training_set``); it stays import-light on purpose.
"""
from __future__ import annotations


def run(ctx):
    """Stage entry (scripts/data.py): the load benchmark. Imported lazily to keep `api` light."""
    from gpulab.data.stage import run as _run

    return _run(ctx)
