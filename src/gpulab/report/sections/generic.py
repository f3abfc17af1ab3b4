"""Fallback section for a stage without its own renderer: every table of every result."""
from __future__ import annotations

from pathlib import Path

from gpulab import results
from gpulab.report.html import Figures, esc

TITLE = "Results"


def render(files: list[Path], figs: Figures) -> str:
    parts = []
    for f in files:
        a = results.read_attrs(f)
        parts.append(f"<h3>{esc(a.get('variant'))} on {esc(a.get('host'))} "
                     f"({esc(a.get('device_kind'))})</h3>")
        for name in results.list_contents(f)["tables"]:
            parts.append(figs.table(results.read_table(f, name), f"{a.get('stage')}: {name}"))
    return "\n".join(parts)
