"""Opening HDF5 files and finding their datasets, with errors that name the file and the key.

Kept apart from :mod:`gpulab.data.api` (which needs torch for its Dataset) so that checking the
user's input files at Snakefile parse time does not import torch.
"""
from __future__ import annotations

import os
from pathlib import Path

import h5py

from gpulab.data.errors import DataError


def open_h5(path: str | os.PathLike) -> h5py.File:
    """Open an HDF5 file read-only, turning h5py's errors into a DataError naming the file."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, "file does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as exc:  # truncated / not HDF5 / corrupt superblock
        raise DataError(path, f"not a readable HDF5 file ({exc})") from None


def require_datasets(f: h5py.File, path, *keys: str) -> list[h5py.Dataset]:
    """The named datasets of an open file, or a DataError naming the first missing one."""
    for key in keys:
        if key not in f:
            raise DataError(path, f"no dataset {key!r} (has: {sorted(f.keys())})", key=key)
        if not isinstance(f[key], h5py.Dataset):
            raise DataError(path, "is a group, not a dataset", key=key)
    return [f[k] for k in keys]
