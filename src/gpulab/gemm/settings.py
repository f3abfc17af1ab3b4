"""The `gemm` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class PerDevice(TypedSection):
    """The per-GPU health figure (gpulab.gemm.perdevice); size 0: not measured."""

    size: int
    cpu_size: int
    dtypes: tuple[str, ...]
    cpu_dtypes: tuple[str, ...]
    seconds: float
    cpu_seconds: float
    warmup_max_s: float
    cpu_warmup_max_s: float


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `gemm` section (each key's type, default and meaning: schema.yaml)."""

    gpus: str | int
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    algorithms: tuple[str, ...]
    ranks: tuple[int, ...]
    summa_panels: int
    p2p_off: bool
    bar_size: int
    seed: int
    warmup: int
    repeats: int
    per_device: PerDevice
