"""The report: every result that exists, rendered into one self-contained HTML file.

Results are read only through :mod:`gpulab.results`; each stage's section comes from
``gpulab.report.sections.<stage>`` (or a generic table dump where a stage has none).
"""
from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from gpulab import results
from gpulab.report import sections
from gpulab.report.html import Figures, esc, page

log = logging.getLogger("gpulab.report")


def group_by_stage(files: Iterable[Path]) -> dict[str, list[Path]]:
    by_stage: dict[str, list[Path]] = defaultdict(list)
    for f in files:
        try:
            stage = results.read_attrs(f).get("stage", "unknown")
        except OSError as exc:
            log.warning("skipping unreadable result %s: %s", f, exc)
            continue
        by_stage[stage].append(Path(f))
    return by_stage


def provenance_table(files: list[Path], figs: Figures) -> str:
    import pandas as pd

    rows = []
    for f in files:
        a = results.read_attrs(f)
        rows.append({"file": str(f), "stage": a.get("stage"), "host": a.get("host"),
                     "device": a.get("device_kind"), "devices": a.get("device_ids"),
                     "git": str(a.get("git_commit", ""))[:10] + ("+dirty" if a.get("git_dirty") else ""),
                     "config_hash": a.get("config_hash"), "result_id": str(a.get("result_id"))[:12],
                     "finished": a.get("finished_at")})
    return figs.table(pd.DataFrame(rows), "Provenance of every result in this report.", max_rows=500)


def build(files: Iterable[str | Path], title: str) -> str:
    files = sorted({Path(f) for f in files})
    by_stage = group_by_stage(files)
    figs = Figures()
    body = [f"<h1>{esc(title)}</h1>",
            f"<p>Generated {esc(results.now_iso())} from {len(files)} result file(s).</p>"]
    order = sections.ORDER + sorted(set(by_stage) - set(sections.ORDER))
    n = 0
    for stage in order:
        if stage not in by_stage:
            continue
        mod = sections.module_for(stage) or sections.module_for("generic")
        n += 1
        title_s = getattr(mod, "TITLE", stage)
        log.info("report: section %s (%d result(s))", stage, len(by_stage[stage]))
        body.append(f'<section id="{esc(stage)}"><h2>{n}. {esc(title_s)}</h2>'
                    f"{mod.render(by_stage[stage], figs)}</section>")
    body.append('<section id="provenance"><h2>Appendix: provenance</h2>'
                f"{provenance_table(files, figs)}</section>")
    return page(title, "\n".join(body))
