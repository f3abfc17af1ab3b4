"""Damaged results in the report: what is missing, named in the abstract, never silently left out.

A result the report cannot read whole (:class:`gpulab.results.DamagedResult`) is left out of its
chapter; the abstract then says which stage's chapter lacks which host's result, why, and the
command that redoes it, and the report counts each as an error (its command exits 1).
"""
from __future__ import annotations

from gpulab import results
from gpulab.kit.html import esc


def abstract_note(damaged: list[results.DamagedResult]) -> str:
    """The abstract's box listing every damaged result; empty when there is none."""
    if not damaged:
        return ""
    items = "".join(
        f"<li><b>{esc(d.stage)}</b> on {esc(d.host)}: {esc(str(d.path))} is damaged "
        f"({esc(d.why)}). Redo it: <code>{esc(d.redo)}</code></li>" for d in damaged)
    stages = sorted({d.stage for d in damaged})
    return (f'<div class="section-error"><b>Missing from this report</b>: {len(damaged)} damaged '
            f"result file(s), so the chapter(s) {esc(', '.join(stages))} lack them (a chapter "
            f"with no readable result is absent):<ul>{items}</ul></div>")


def errors(damaged: list[results.DamagedResult]) -> list[str]:
    """One report error per damaged result (the report's error count and log)."""
    return [str(d) for d in damaged]
