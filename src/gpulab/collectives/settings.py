"""The `collectives` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `collectives` section (each key's type, default and meaning: schema.yaml)."""

    gpus: str | int
    variants: tuple[str, ...]
    ops: tuple[str, ...]
    algorithms: tuple[str, ...]
    sizes_bytes: tuple[int, ...]
    warmup: int
    repeats: int
    iters: int
    seed: int
    slice_bytes: int
    max_slices: int
    nccl_tests_bin: str | None
    timeout_s: float
