"""Training-set files: the interface between the data stage and the training stage.

A training set is one HDF5 file with two datasets, ``x`` (features, float32, [N, ...]) and ``y``
(labels, int64, [N]), chunked along the sample axis, and a JSON ``meta`` attribute (name, source,
number of classes, ...). :func:`write_training_set` writes it atomically; :class:`H5Dataset` reads
it sample by sample (or batch by batch) for a ``torch.utils.data.DataLoader``.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from gpulab.data.errors import DataError
from gpulab.data.formats import atomic_path
from gpulab.data.h5files import open_h5, require_datasets  # noqa: F401 (part of this API)

# ~1 MiB chunks: big enough for fast sequential reads, small enough that a random sample read
# does not pull in much more than it needs.
CHUNK_BYTES = 1 << 20


def check_xy(path, x_shape: tuple, x_dtype, y_shape: tuple, y_dtype, x_key="x", y_key="y"):
    """Shape and dtype rules every training set obeys (checked on write and on open)."""
    if len(x_shape) < 1 or x_shape[0] == 0:
        raise DataError(path, f"features have shape {x_shape}; need [N, ...] with N > 0", key=x_key)
    if not np.issubdtype(x_dtype, np.floating):
        raise DataError(path, f"features have dtype {x_dtype}; need a floating type", key=x_key)
    if len(y_shape) != 1:
        raise DataError(path, f"labels have shape {y_shape}; need [N]", key=y_key)
    if not np.issubdtype(y_dtype, np.integer):
        raise DataError(path, f"labels have dtype {y_dtype}; need an integer type", key=y_key)
    if x_shape[0] != y_shape[0]:
        raise DataError(path, f"{x_shape[0]} feature rows but {y_shape[0]} labels", key=y_key)


def chunk_rows(sample_shape: Sequence[int], itemsize: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    per_row = max(1, int(np.prod(sample_shape, dtype=np.int64)) * itemsize)
    return max(1, chunk_bytes // per_row)


def write_training_set(path: str | os.PathLike, x: np.ndarray, y: np.ndarray,
                       meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``x`` (float32 [N, ...]) and ``y`` (int64 [N]) to ``path`` atomically.

    Features are stored as float32 and labels as int64 whatever the input precision, after checking
    that no information is lost: features must be finite, labels whole and non-negative.
    """
    path = Path(path)
    x = np.asarray(x)
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.floating):
        if np.isnan(y).any():
            raise DataError(path, f"label {int(np.flatnonzero(np.isnan(y))[0])} is NaN", key="y")
        if not np.array_equal(y, np.round(y)):
            raise DataError(path, "labels are not whole numbers", key="y")
        y = y.astype(np.int64)
    check_xy(path, x.shape, x.dtype, y.shape, y.dtype)
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))[0])
        raise DataError(path, f"sample {bad} has a NaN or infinite feature", key="x")
    if (y < 0).any():
        raise DataError(path, f"label {int(np.flatnonzero(y < 0)[0])} is negative", key="y")
    x = x.astype(np.float32, copy=False)
    y = y.astype(np.int64, copy=False)
    meta = dict(meta or {})
    meta.setdefault("num_classes", int(y.max()) + 1)
    meta.setdefault("num_samples", int(len(y)))
    meta.setdefault("sample_shape", list(x.shape[1:]))

    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        rows = min(len(x), chunk_rows(x.shape[1:], x.itemsize))
        f.create_dataset("x", data=x, chunks=(rows, *x.shape[1:]))
        f.create_dataset("y", data=y, chunks=(min(len(y), chunk_rows((), 8)),))
        f.attrs["meta"] = json.dumps(meta, sort_keys=True, default=str)
    return path


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    with open_h5(path) as f:
        return json.loads(f.attrs.get("meta", "{}"))


def read_training_set(path: str | os.PathLike, x_key: str = "x", y_key: str = "y"):
    """The whole training set in memory: ``(x, y, meta)`` as numpy arrays and a dict."""
    with open_h5(path) as f:
        xd, yd = _datasets(f, path, x_key, y_key)
        try:
            x, y = xd[()], yd[()]
        except OSError as exc:  # a damaged chunk
            raise DataError(path, f"cannot read data ({exc})", key=x_key) from None
        return x, y, json.loads(f.attrs.get("meta", "{}"))


def _datasets(f: h5py.File, path, x_key: str, y_key: str):
    xd, yd = require_datasets(f, path, x_key, y_key)
    check_xy(path, xd.shape, xd.dtype, yd.shape, yd.dtype, x_key, y_key)
    return xd, yd


class H5Dataset(Dataset):
    """``(x, y)`` samples from a training-set HDF5 file, as torch tensors.

    The file is opened lazily, once per process: an HDF5 handle must not be shared across
    ``fork()``, so a DataLoader worker (forked or spawned) that touches the dataset opens its own
    handle, and the parent's handle (if any) is never used in a child. Pickling drops the handle.
    ``__getitems__`` lets a DataLoader read a whole batch with one fancy-indexed HDF5 read.
    """

    def __init__(self, path: str | os.PathLike, x_key: str = "x", y_key: str = "y",
                 transform: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.path = Path(path)
        self.x_key, self.y_key, self.transform = x_key, y_key, transform
        with open_h5(self.path) as f:  # validate now, so a bad file fails before training starts
            xd, _ = _datasets(f, self.path, x_key, y_key)
            self._len = int(xd.shape[0])
            self.sample_shape = tuple(int(s) for s in xd.shape[1:])
            self.meta: dict[str, Any] = json.loads(f.attrs.get("meta", "{}"))
        self._file: h5py.File | None = None
        self._pid: int | None = None

    @property
    def num_classes(self) -> int | None:
        return self.meta.get("num_classes")

    def __len__(self) -> int:
        return self._len

    def _handle(self) -> h5py.File:
        if self._file is None or self._pid != os.getpid():
            # In a forked child the inherited handle belongs to the parent: forget it (without
            # closing it: closing would act on state shared with the parent) and open our own.
            self._file = open_h5(self.path)
            self._pid = os.getpid()
        return self._file

    def _index(self, i) -> int:
        i = int(i)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"{self.path}: index {i} out of range for {self._len} samples")
        return i

    def _pair(self, x: np.ndarray, y) -> tuple[torch.Tensor, torch.Tensor]:
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        yt = torch.tensor(int(y), dtype=torch.int64)
        return (self.transform(xt) if self.transform else xt), yt

    def __getitem__(self, i) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._index(i)
        f = self._handle()
        return self._pair(f[self.x_key][i], f[self.y_key][i])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch in one read: h5py wants sorted unique indices, so read those and reorder."""
        idx = np.array([self._index(i) for i in indices], dtype=np.int64)
        if len(idx) == 0:
            return []
        uniq, inverse = np.unique(idx, return_inverse=True)
        f = self._handle()
        xs, ys = f[self.x_key][uniq], f[self.y_key][uniq]
        return [self._pair(xs[j], ys[j]) for j in inverse]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"], state["_pid"] = None, None
        return state

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file, self._pid = None, None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"H5Dataset({str(self.path)!r}, n={self._len}, sample_shape={self.sample_shape})"
