"""DataFrame helpers shared by the report's stage sections: tables collected across hosts, host
labels, checks sentences, reference rows."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping

import pandas as pd

from gpulab import results
from gpulab.outcomes import Reference, Verdict, references_frame

# The columns of a collected ``bars`` table a section shows.
BAR_SHOWN = ["host", "bar", "measured", "reference", "ratio", "threshold", "unit", "verdict",
             "source", "note"]

# Identity columns results.collect adds; sections show the host label instead.
META = ["stage", "variant", "device_kind", "result_id"]


def host_label(a: Mapping, count: str, cpu: str, unnamed: str = "GPU") -> str:
    """A result's host and devices from its root attributes ``a``: "h200 (2x NVIDIA H200)", the
    number from attribute ``count`` (each stage counts its own: ranks, devices used, available);
    on CPU virtual devices "host (<cpu>)", ``cpu`` formatted with ``n`` (the stage's wording).
    ``unnamed``: the device name shown where the result records none."""
    n = a.get(count, "?")
    if a.get("device_kind") == "cpu":
        return f"{a.get('host', '?')} ({cpu.format(n=n)})"
    names = a.get("device_names") or [unnamed]  # a stage that records every device's name
    return f"{a.get('host', '?')} ({n}x {a.get('device_name', names[0])})"


def host_kind(a: Mapping) -> str:
    """"host (cuda)" / "host (cpu)": a result's host and device kind."""
    return f"{a.get('host')} ({a.get('device_kind')})"


def host_kind_column(df: pd.DataFrame) -> pd.Series:
    """:func:`host_kind` of every row of a collected table (its ``host`` and ``device_kind``)."""
    return df["host"].astype(str) + " (" + df["device_kind"].astype(str) + ")"


def failed_suffix(a: Mapping) -> str:
    """What a headline adds for a failed result: " FAILED: <verdict summary>.", else nothing."""
    return "" if a.get("verdict") != Verdict.FAIL else f" FAILED: {a.get('verdict_summary')}."


def collect_labelled(files: list[Path], table: str, label: Callable[[dict], str]) -> pd.DataFrame:
    """One table across result files, its ``host`` column replaced by ``label(attrs)`` of each file
    (e.g. "h200 (1x NVIDIA H200)"), so hosts and device kinds read side by side."""
    df = results.collect(files, table)
    if df.empty:
        return df
    labels = {str(a.get("result_id")): label(a) for a in map(results.read_attrs, files)}
    df["host"] = df["result_id"].astype(str).map(labels)
    return df.drop(columns=[c for c in META if c in df.columns])


def collect_tagged(files_attrs: Iterable[tuple[Path, Mapping]], table: str,
                   tags: Callable[[Mapping], dict], keep_empty: bool = False) -> pd.DataFrame:
    """One table across result files, every column kept, each file's rows led by the columns
    ``tags(attrs)`` gives (a host label, its variant) where the table lacks them. ``files_attrs``:
    (file, its root attributes) pairs. An empty table counts only with ``keep_empty``."""
    frames = []
    for f, a in files_attrs:
        if table not in results.list_contents(f)["tables"]:
            continue
        df = results.read_table(f, table)
        if df.empty and not keep_empty:
            continue
        for i, (column, value) in enumerate(c for c in tags(a).items() if c[0] not in df):
            df.insert(i, column, value)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _crashed(row) -> bool:
    return isinstance(getattr(row, "note", None), str) and row.note.startswith("crashed:")


def _first_line(text: str, limit: int = 400) -> str:
    return text.strip().splitlines()[0][:limit]


def checks_summary(files: list[Path], what: str = "checks verified") -> str:
    """"N of M <what>, K failed: ..." over the ``checks`` tables of ``files``.

    Not-applicable checks are not counted; a crashed case is a failed check and is named.
    """
    checks = results.collect(files, "checks")
    if checks.empty:
        return "No checks recorded."
    judged = checks[checks["verdict"] != Verdict.NOT_APPLICABLE]
    failed = judged[judged["verdict"] == Verdict.FAIL]
    text = f"{len(judged) - len(failed)} of {len(judged)} {what}"
    if len(failed):
        # A crash names its cause (e.g. the launch's first failing rank, its signal and log).
        names = [f"{r.check} [{r.case}]" + (f" ({_first_line(r.note)})" if _crashed(r) else "")
                 for r in failed.itertuples()]
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        text += f", {len(failed)} failed: " + "; ".join(names[:3]) + more
    return text + "."


def bar_references(bars: pd.DataFrame) -> pd.DataFrame:
    """A section's ``references`` rows from its collected ``bars`` (those with a reference)."""
    b = bars[bars["reference"].notna()] if not bars.empty else bars
    return references_frame(Reference.of_bar(f"{r.bar} ({r.host})", r) for r in b.itertuples())
