"""The `transfer` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `transfer` section (each key's type, default and meaning: schema.yaml)."""

    gpus: str | int
    warmup: int
    repeats: int
    copies: int
    matrix_bytes: int
    latency_bytes: int
    latency_copies: int
    p2p_sizes: tuple[int, ...]
    host_sizes: tuple[int, ...]
    sweep_target_bytes: int
    host_threads: tuple[int, ...]
    host_threads_bytes: int
    hybrid_bytes: int
    hybrid_chunk_bytes: int
    malloc_count: int
    malloc_bytes: int
    spin_timeout_clocks: int
    seed: int
