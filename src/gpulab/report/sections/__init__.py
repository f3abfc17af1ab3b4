"""One module per stage renders that stage's section; the report finds them by stage name.

A section module defines ``TITLE`` and ``render(files: list[Path], figs: Figures) -> str`` (HTML),
reading results only through :mod:`gpulab.results`.
"""
from __future__ import annotations

import importlib
from types import ModuleType

ORDER = ["probe", "data", "transfer", "kernels", "collectives", "sort", "gemm", "train"]


def module_for(stage: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"gpulab.report.sections.{stage}")
    except ModuleNotFoundError as exc:
        if exc.name == f"gpulab.report.sections.{stage}":
            return None
        raise
