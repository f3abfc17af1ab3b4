"""What each result judged, in one line per result for the abstract (issue 24).

A verdict alone hides what stands behind it: a CPU host whose every bar is not applicable passes on
its checks alone. So each line names the counts (judged, failed, not applicable) and, where no bar
was judged, why: ``pass (no bar judged: <reasons>)``, the reasons taken from the not-applicable bars
and rows of that result, deduplicated and shortened.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gpulab import outcomes, results
from gpulab.kit.html import esc

# Reasons shown per line, and characters per reason: the abstract stays a summary.
MAX_REASONS = 2
REASON_CHARS = 60


def _short(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + "..."


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'s' * (k != 1)}"


def no_bar_reasons(tables: dict[str, pd.DataFrame]) -> list[str]:
    """Why nothing could be judged: notes of not-applicable bars, then reasons of not-applicable
    rows; deduplicated (first seen wins), each shortened."""
    out: list[str] = []
    bars = tables.get(outcomes.BARS)
    if bars is not None and len(bars) and "verdict" in bars:
        na = bars[bars["verdict"] == outcomes.Verdict.NOT_APPLICABLE.value]
        out += [str(n) for n in na.get("note", pd.Series(dtype=str)) if str(n).strip()]
    rows = tables.get(outcomes.NOT_APPLICABLE)
    if rows is not None and len(rows) and "reason" in rows:
        out += [str(r) for r in rows["reason"] if str(r).strip()]
    seen: dict[str, None] = {}
    for r in out:
        seen.setdefault(_short(r), None)
    return list(seen)


@dataclass
class Line:
    """One result's verdict line."""

    stage: str
    host: str
    variant: str
    verdict: str  # one of the three values
    text: str     # the verdict as the abstract reads it, e.g. "pass (no bar judged: one device)"
    counts: dict

    def html(self) -> str:
        c = self.counts
        na = c["checks_not_applicable"] + c["bars_not_applicable"] + c["not_applicable"]
        where = self.host + ("" if self.variant in ("", "main") else f", {self.variant}")
        return (f'<li class="verdict-{esc(self.verdict)}"><b>{esc(self.stage)}</b> on {esc(where)}: '
                f"<b>{esc(self.text)}</b>; {c['judged']} judged ({_n(c['checks'], 'check')}, "
                f"{_n(c['bars'] - c['bars_not_applicable'], 'bar')}), {c['failed']} failed, "
                f"{na} not applicable ({_n(c['bars_not_applicable'], 'bar')}, "
                f"{c['not_applicable'] + c['checks_not_applicable']} other).</li>")


def line_of(stage: str, host: str, variant: str, tables: dict[str, pd.DataFrame]) -> Line:
    ov = outcomes.overall(tables)
    c = ov["counts"]
    text = ov["verdict"]
    bars_judged = c["bars"] - c["bars_not_applicable"]
    if ov["verdict"] != outcomes.Verdict.FAIL.value and bars_judged == 0:
        reasons = no_bar_reasons(tables) or ["no bar is defined for this result"]
        shown = "; ".join(reasons[:MAX_REASONS])
        if len(reasons) > MAX_REASONS:
            shown += f"; and {len(reasons) - MAX_REASONS} more"
        what = "no bar judged" if c["checks"] else "nothing judged"
        text = f"{ov['verdict']} ({what}: {shown})"
    return Line(stage, host, variant, ov["verdict"], text, c)


def lines(files: list[Path]) -> list[Line]:
    """One line per result file, in the order given."""
    out = []
    for f in files:
        a = results.read_attrs(f)
        have = set(results.list_contents(f)["tables"])
        tables = {t: results.read_table(f, t) for t in
                  (outcomes.BARS, outcomes.CHECKS, outcomes.NOT_APPLICABLE) if t in have}
        out.append(line_of(str(a.get("stage")), str(a.get("host")), str(a.get("variant", "")), tables))
    return out


def html(items: list[Line]) -> str:
    if not items:
        return ""
    return ('<p>Verdicts, one line per result (judged = checks and bars with a pass/fail verdict; '
            'the bars tables list every bar):</p><ul class="verdicts">'
            + "".join(i.html() for i in items) + "</ul>")
