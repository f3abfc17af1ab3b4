"""The `sort` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `sort` section (each key's type, default and meaning: schema.yaml)."""

    gpus: str | int
    algorithms: tuple[str, ...]
    baselines: tuple[str, ...]
    device_counts: tuple[int, ...]
    key_types: tuple[str, ...]
    distributions: tuple[str, ...]
    sweep_sizes: tuple[int, ...]
    matrix_size: int
    bar_keys: int
    verify_numpy_max_keys: int
    numpy_max_keys: int
    warmup: int
    repeats: int
    seed: int
