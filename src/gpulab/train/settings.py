"""The `train` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class Gpt(TypedSection):
    """TinyGPT for pipeline and tensor parallel (synthetic tokens)"""

    vocab: int
    seq_len: int
    d_model: int
    n_heads: int
    n_layers: int


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `train` section (each key's type, default and meaning: schema.yaml)."""

    gpus: str | int
    variants: tuple[str, ...]
    models: tuple[str, ...]
    mlp_hidden: tuple[int, ...]
    seed: int
    lr: float
    momentum: float
    warmup: int
    repeats: int
    batch_sizes: tuple[int, ...]
    curve_batch: int
    curve_epochs: int
    freeze_after_steps: int
    device_counts: str | tuple[int, ...]
    global_batches: tuple[int, ...]
    per_device_batch: int
    bucket_cap_mb: tuple[float, ...]
    comm_hooks: tuple[str, ...]
    powersgd_rank: int
    lr_warmup_steps: int
    equivalence_steps: int
    equivalence_batch: int
    equivalence_tolerance: float
    float32_tolerance: float
    gpt: Gpt
    pipeline_batch: int
    microbatches: tuple[int, ...]
    schedules: tuple[str, ...]
    tensor_batches: tuple[int, ...]
