"""The README's table of a run, generated from that run's committed export (docs/runs/<date>-<gpu>/),
so every number in it traces to a row of a file in the repository instead of being typed by hand.

One line per bar that was judged (pass or fail): what was measured, the measured value, the
reference with its source, the ratio and the verdict, all read from the export's ``bars`` rows.
The block sits between two markers in README.md; ``--update`` rewrites it, ``--check`` fails when
the README's block differs from what the export gives.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from gpulab import export
from gpulab.outcomes import JUDGED

BEGIN = "<!-- gpulab:readme-table {source} -->"
END = "<!-- /gpulab:readme-table -->"
_BLOCK = re.compile(r"<!-- gpulab:readme-table (\S+) -->\n.*?<!-- /gpulab:readme-table -->", re.S)
HEADER = ["| measurement | host | measured | reference (source) | ratio | verdict |",
          "|---|---|---|---|---|---|"]


def fmt(v: float) -> str:
    """Numbers as the table shows them (4 significant digits; the export keeps them all)."""
    return f"{v:.4g}"


def bar_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per judged bar of the export: bar, host, unit, measured, reference, ratio, source,
    verdict (the keys of the export's bars rows, pivoted back)."""
    b = df[(df["table"] == "bars") & (df["statistic"] == "value")]
    rows = {}
    for r in b.itertuples():
        keys = json.loads(r.keys)
        if keys.get("verdict") not in JUDGED:
            continue
        k = (r.stage, r.host, keys["bar"])
        rows.setdefault(k, {"stage": r.stage, "host": r.host, "bar": keys["bar"],
                            "unit": r.unit, "source": keys.get("source", ""),
                            "verdict": keys["verdict"]})[r.metric] = r.value
    cols = ["stage", "host", "bar", "unit", "source", "verdict", "measured", "reference", "ratio"]
    return pd.DataFrame(list(rows.values()), columns=cols)


def table(export_path: str | Path) -> str:
    rows = bar_rows(export.read(export_path))
    lines = list(HEADER)
    for r in rows.itertuples():
        lines.append(f"| {r.stage}: {r.bar} | {r.host} | {fmt(r.measured)} {r.unit} | "
                     f"{fmt(r.reference)} {r.unit} ({r.source}) | {fmt(r.ratio)} | {r.verdict} |")
    return "\n".join(lines)


def block(export_path: str | Path, source: str | None = None) -> str:
    return (BEGIN.format(source=source or Path(export_path).as_posix()) + "\n"
            + table(export_path) + "\n" + END)


def parse(markdown: str) -> list[dict]:
    """The rows of a generated table (for checking it against its export)."""
    out = []
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] in ("measurement", "---"):
            continue
        stage, bar = cells[0].split(": ", 1)
        ref, source = cells[3].split(" ", 1)
        out.append({"stage": stage, "bar": bar, "host": cells[1],
                    "measured": float(cells[2].split()[0]), "reference": float(ref),
                    "source": source.split("(", 1)[1].rsplit(")", 1)[0], "ratio": float(cells[4]),
                    "verdict": cells[5]})
    return out


def update(readme: str | Path, export_path: str | Path, check: bool = False) -> bool:
    """Rewrite (or, with ``check``, compare) the README's block for ``export_path``; True when the
    README already matched. A README without the block gets it appended (not in check mode)."""
    readme = Path(readme)
    text = readme.read_text()
    src = Path(export_path).as_posix()
    new = block(export_path, src)
    found = [m for m in _BLOCK.finditer(text) if m.group(1) == src]
    if found:
        m = found[0]
        same = m.group(0) == new
        text = text[:m.start()] + new + text[m.end():]
    else:
        same = False
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    if not check and not same:
        from gpulab.results import atomic_write_text

        atomic_write_text(readme, text)
    return same
