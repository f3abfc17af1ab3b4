"""The `kernels` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class Split(TypedSection):
    """the image cut into equal chunks, one per device"""

    bytes: int
    chunks: int
    streams: int
    pinned: tuple[bool, ...]


@dataclass(frozen=True)
class Jobs(TypedSection):
    """independent kernel jobs run by Snakemake, one GPU each"""

    count: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `kernels` section (each key's type, default and meaning: schema.yaml)."""

    gpus: str | int
    divisor: int
    sizes_bytes: tuple[int, ...]
    variants: tuple[str, ...]
    kernel: str
    block: int
    repeats: int
    warmup: int
    batch_bytes: int
    split: Split
    jobs: Jobs
