"""One module per stage renders that stage's section; the report finds it through the registry.

A stage's section module is the one its spec names (:meth:`gpulab.stages.StageSpec.section_module`:
``gpulab.<stage>.section`` for a stage that keeps its section in its own package, else
``gpulab.report.sections.<stage>``); a stage without one gets the generic section. The report order
is the registry's. The contract of a section module:

- ``TITLE: str``
- ``render(files: list[Path], figs: Figures) -> str``: HTML (figures, tables; hosts side by side)
- ``METHODS: str``: methodology and counting conventions (HTML)
- ``headlines(files) -> list[str]``: 1-3 sentences with the key numbers, for the abstract
- optional ``references(files) -> DataFrame``: :class:`gpulab.outcomes.Reference` rows
  (:func:`gpulab.outcomes.references_frame`)

Sections read results only through :mod:`gpulab.results`. A section that raises must not take the
report down: :class:`Section` calls every hook through :meth:`Section.call`, which logs the error and
records it, and the report shows an error box naming the stage and the exception instead.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from gpulab import stages

ORDER = stages.ORDER

log = logging.getLogger("gpulab.report")


def module_for(stage: str) -> ModuleType | None:
    """The stage's section module; None where it has none (a missing module, not a broken one)."""
    name = (stages.STAGES[stage].section_module() if stage in stages.STAGES
            else f"gpulab.report.sections.{stage}")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


@dataclass
class Section:
    """A stage's section module (or the generic one), with every hook guarded."""

    stage: str
    module: ModuleType | None
    errors: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, stage: str) -> "Section":
        try:
            mod = module_for(stage)
        except Exception as exc:  # a broken section module (syntax error, bad import)
            s = cls(stage, None)
            s._record("import", exc)
            return s
        return cls(stage, mod or module_for("generic"))

    @property
    def title(self) -> str:
        return str(getattr(self.module, "TITLE", None) or self.stage)

    def _record(self, hook: str, exc: BaseException) -> None:
        msg = f"section '{self.stage}', {hook}: {type(exc).__name__}: {exc}"
        log.error("report: %s", msg, exc_info=exc)
        self.errors.append(msg)

    def call(self, hook: str, *args, default: Any = None, check: Callable[[Any], Any] | None = None):
        """``module.<hook>(*args)``; on an exception (or a failed ``check``) log it and return default."""
        fn = getattr(self.module, hook, None)
        if fn is None:
            return default
        try:
            out = fn(*args) if callable(fn) else fn
            if check is not None:
                check(out)
            return out
        except Exception as exc:  # noqa: BLE001 - any failure of a section is reported, not raised
            self._record(hook, exc)
            return default


def _is_str(v) -> None:
    if not isinstance(v, str):
        raise TypeError(f"expected str, got {type(v).__name__}")


def _is_str_list(v) -> None:
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
        raise TypeError(f"expected a list of str, got {v!r:.120}")


CHECK_STR = _is_str
CHECK_STR_LIST = _is_str_list
