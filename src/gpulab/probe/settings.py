"""The `probe` stage's typed view of its config section (see gpulab.config.TypedSection)."""
from __future__ import annotations

from dataclasses import dataclass

from gpulab.config import TypedSection


@dataclass(frozen=True)
class Settings(TypedSection):
    """The validated `probe` section (each key's type, default and meaning: schema.yaml)."""

    gpus: str | int
