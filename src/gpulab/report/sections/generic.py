"""Fallback section for a stage without its own renderer: every table, hosts side by side.

Each table name becomes one table over all result files of the stage, with host, variant and device
kind columns in front, so results copied from other hosts line up row by row; matrices become
heatmaps, one panel per result.
"""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from gpulab import results  # noqa: E402
from gpulab.kit.html import Figures, esc  # noqa: E402

TITLE = "Results"

METHODS = ("<p>This stage has no section of its own yet: its tables are shown as recorded, with the "
           "units stored beside each column; see the stage's module documentation for its method.</p>")


def _units_caption(df: pd.DataFrame) -> str:
    units = df.attrs.get("units") or {}
    return "; units: " + ", ".join(f"{c} [{u}]" for c, u in units.items()) if units else ""


def _matrix_figure(files: list[Path], name: str, figs: Figures) -> str:
    mats = []
    for f in files:
        if name in results.list_contents(f)["matrices"]:
            m, meta = results.read_matrix(f, name)
            if np.issubdtype(np.asarray(m).dtype, np.number):
                mats.append((results.read_attrs(f), m, meta))
    if not mats:
        return ""
    fig, axes = plt.subplots(1, len(mats), figsize=(1.5 + 3.2 * len(mats), 3.2), squeeze=False)
    for ax, (a, m, meta) in zip(axes[0], mats):
        sns.heatmap(pd.DataFrame(m, index=meta.get("rows"), columns=meta.get("cols")), annot=m.size <= 64,
                    fmt=".3g", cmap="viridis", ax=ax)
        ax.set_title(f"{a.get('host')} / {a.get('variant')}", fontsize=9)
    unit = mats[0][2].get("unit", "?")
    return figs.figure(fig, f"{mats[0][0].get('stage')}: matrix '{name}' [{unit}], one panel per "
                            "host/variant (rows: source, columns: destination where applicable).")


def render(files: list[Path], figs: Figures) -> str:
    stage = results.read_attrs(files[0]).get("stage") if files else "?"
    tables = sorted({t for f in files for t in results.list_contents(f)["tables"]})
    matrices = sorted({m for f in files for m in results.list_contents(f)["matrices"]})
    parts = [f"<p>{len(files)} result file(s) of stage <code>{esc(stage)}</code>: "
             f"{len(tables)} table(s), {len(matrices)} matrix(es).</p>"]
    for name in tables:
        df = results.collect(files, name).drop(columns=["result_id", "stage"], errors="ignore")
        parts.append(figs.table(df, f"{stage}: table '{name}', all hosts{_units_caption(df)}."))
    for name in matrices:
        parts.append(_matrix_figure(files, name, figs))
    return "\n".join(parts)


def headlines(files: list[Path]) -> list[str]:
    return []
