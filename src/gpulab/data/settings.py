"""The `data` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class Train(TypedSection):
    """the training sets written for the training stage (digits is always 1797 samples)"""

    tabular_rows: int
    tabular_features: int
    tabular_classes: int


@dataclass(frozen=True)
class Input(TypedSection):
    """One of the extra data files (`format` None: guessed from the suffix)."""

    path: str
    format: str | None
    label: str


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `data` section (each key's type, default and meaning: schema.yaml)."""

    seed: int
    train: Train
    tabular_rows: tuple[int, ...]
    tabular_features: int
    image_rows: tuple[int, ...]
    image_shape: tuple[int, ...]
    classes: int
    text_max_rows: int | None
    inputs: tuple[Input, ...]
    digits: bool
    formats: tuple[str, ...]
    gzip_level: int
    batch_rows: int
    repeats: int
    warmup: int
