"""The datasets: scikit-learn's bundled digits (real, offline) and deterministic synthetic ones.

Every dataset is a :class:`Dataset`: features ``x`` (float32, [N, *sample_shape]), labels ``y``
(int64, [N]) and the column names used by the tabular formats (CSV, JSON). Synthetic data is drawn
from ``numpy.random.default_rng(seed)``, so the same config gives the same bytes on every host.
Synthetic labels come from a fixed random "teacher", so a model can actually learn them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

LABEL = "label"


@dataclass
class Dataset:
    name: str
    x: np.ndarray
    y: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.x = np.ascontiguousarray(self.x, dtype=np.float32)
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if len(self.x) != len(self.y):
            raise ValueError(f"dataset {self.name}: {len(self.x)} samples but {len(self.y)} labels")
        self.meta.setdefault("name", self.name)
        self.meta.setdefault("num_classes", int(self.y.max()) + 1 if len(self.y) else 0)

    @property
    def rows(self) -> int:
        return len(self.y)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def columns(self) -> list[str]:
        """Feature column names of the flat (tabular) layout: f0..fK-1, or p0..pK-1 for images."""
        k = int(np.prod(self.sample_shape, dtype=np.int64))
        prefix = "p" if len(self.sample_shape) > 1 else "f"
        return [f"{prefix}{i}" for i in range(k)]

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes)


def digits() -> Dataset:
    """scikit-learn's 1797 8x8 handwritten digits, scaled from 0..16 to [0, 1], as [N, 1, 8, 8]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    return Dataset("digits", x, d.target.astype(np.int64),
                   {"source": "sklearn.datasets.load_digits", "num_classes": 10})


def tabular(rows: int, features: int, classes: int, seed: int) -> Dataset:
    """Gaussian features; label = argmax of a fixed random linear teacher plus a little noise."""
    _check_sizes("tabular", rows=rows, features=features, classes=classes)
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((features, classes)).astype(np.float32)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    logits = x @ teacher + 0.1 * rng.standard_normal((rows, classes), dtype=np.float32)
    return Dataset(f"tabular-{rows}x{features}", x, logits.argmax(axis=1),
                   {"source": "synthetic", "seed": seed, "num_classes": classes})


def images(rows: int, channels: int, height: int, width: int, classes: int, seed: int) -> Dataset:
    """Image-like [N, C, H, W] data in [0, 1], quantised to 8-bit levels like real pixels: each
    sample is its class template plus noise."""
    _check_sizes("images", rows=rows, channels=channels, height=height, width=width, classes=classes)
    rng = np.random.default_rng(seed)
    shape = (channels, height, width)
    templates = rng.random((classes, *shape), dtype=np.float32)
    y = rng.integers(0, classes, rows)
    noisy = templates[y] + 0.25 * rng.standard_normal((rows, *shape), dtype=np.float32)
    x = np.round(np.clip(noisy, 0.0, 1.0) * 255.0) / 255.0
    return Dataset(f"images-{rows}x{channels}x{height}x{width}", x, y,
                   {"source": "synthetic", "seed": seed, "num_classes": classes})


def _check_sizes(name: str, **sizes: int) -> None:
    for k, v in sizes.items():
        if int(v) < 1:
            raise ValueError(f"dataset {name}: {k} must be >= 1, got {v}")
    if sizes.get("classes", 2) < 2:
        raise ValueError(f"dataset {name}: classes must be >= 2, got {sizes['classes']}")
