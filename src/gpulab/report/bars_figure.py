"""The comparison chapter's figure: bars one row each, comparisons with other machines apart.

A bar is judged (measured / reference against a threshold); a ratio to the seed's RTX A5000 is not.
One axis for both read as if a 6x ratio to another machine were a verdict, so the bars get a panel
of their own (short label, coloured by verdict, the threshold marked on each row) and the other
comparisons (other machines, references without a bar) a second panel, with the line at 1.
"""
from __future__ import annotations

import math

from gpulab.kit.plotting import plt
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from gpulab.outcomes import Verdict  # noqa: E402

COLOURS = {Verdict.PASS.value: "#2a9d4b", Verdict.FAIL.value: "#d0312d"}
OTHER_COLOUR = "#7a8ca8"
LABEL_CHARS = 44


def short(text: str, limit: int = LABEL_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _key(measured, reference) -> tuple:
    """Identity of a (measured, reference) pair, to find a section's reference row that is a bar."""
    def r(x):
        try:
            return round(float(x), 9)
        except (TypeError, ValueError):
            return None
    return r(measured), r(reference)


def bar_rows(bars: pd.DataFrame) -> pd.DataFrame:
    """Judged bars (pass or fail) as rows to plot: label, ratio, threshold, verdict; failed first.

    A failed bar without a valid measurement has no ratio: it is plotted at 0 so it still shows."""
    cols = ["label", "ratio", "threshold", "verdict"]
    if bars.empty:
        return pd.DataFrame(columns=cols)
    b = bars[bars["verdict"].isin(list(COLOURS))].copy()
    multi_host = bars["host"].nunique() > 1 if "host" in bars else False
    label = b["stage"].astype(str) + ": " + b["bar"].astype(str)
    b["label"] = [short(lab + (f" @{h}" if multi_host else "")) for lab, h in
                  zip(label, b.get("host", pd.Series("", index=b.index)))]
    b["ratio"] = pd.to_numeric(b["ratio"], errors="coerce").fillna(0.0)
    b["failed"] = b["verdict"] == Verdict.FAIL
    b = b.sort_values("failed", ascending=False, kind="stable")
    return b[cols].reset_index(drop=True)


def other_rows(references: pd.DataFrame, bars: pd.DataFrame) -> pd.DataFrame:
    """The sections' reference rows that are not one of the bars (other machines, plain
    references), as label and fraction."""
    cols = ["label", "fraction", "source"]
    if references.empty:
        return pd.DataFrame(columns=cols)
    judged = set() if bars.empty else {_key(m, r) for m, r in zip(bars["measured"], bars["reference"])}
    r = references.dropna(subset=["fraction"])
    r = r[[_key(m, ref) not in judged for m, ref in zip(r["measured"], r["reference"])]]
    return pd.DataFrame({"label": [short(f"{s}: {m}") for s, m in zip(r["stage"], r["metric"])],
                         "fraction": r["fraction"].astype(float), "source": r["source"]},
                        columns=cols).reset_index(drop=True)


def _xscale(ax, values) -> None:
    v = np.asarray([x for x in values if math.isfinite(x) and x > 0])
    if len(v) and v.max() / max(v.min(), 1e-12) > 30:  # a wide spread reads only on a log axis
        ax.set_xscale("log")


def figure(bars: pd.DataFrame, others: pd.DataFrame):
    """Two panels (bars above, other comparisons below), or None where both are empty."""
    panels = [p for p in (("bars", bars), ("others", others)) if len(p[1])]
    if not panels:
        return None
    heights = [0.5 + 0.28 * len(d) for _, d in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, 0.6 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (kind, d) in zip(axes[:, 0], panels):
        y = np.arange(len(d))
        if kind == "bars":
            ax.barh(y, d["ratio"], color=[COLOURS[v] for v in d["verdict"]], height=0.7)
            ax.scatter(d["threshold"], y, marker="|", s=260, color="k", zorder=3, label="threshold")
            _xscale(ax, list(d["ratio"]) + list(d["threshold"]))
            ax.set_title("Bars: measured / reference (green pass, red fail; | = threshold)", fontsize=9)
            ax.set_xlabel("ratio")
        else:
            ax.barh(y, d["fraction"], color=OTHER_COLOUR, height=0.7)
            ax.axvline(1.0, color="k", lw=0.8, ls="--")
            _xscale(ax, d["fraction"])
            ax.set_title("Other comparisons, no verdict: other machines and plain references "
                         "(dashed = 1)", fontsize=9)
            ax.set_xlabel("measured / reference")
        ax.set_yticks(y)
        ax.set_yticklabels(d["label"], fontsize=7)
        ax.invert_yaxis()  # the first row (a failed bar) on top
    fig.tight_layout()
    return fig
