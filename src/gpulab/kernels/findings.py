"""Findings of the kernels stage (rules: see gpulab.findings)."""
from __future__ import annotations

from gpulab.findings import Finding, NotMeasurable, Rows
from gpulab.outcomes import JUDGED, Verdict

ROOFLINE_BAR = "vec16 divide vs same-size copy"


def divide_roofline(rows: Rows):
    """The fastest hand-written divide kernel against a same-size copy (the bar's own numbers)."""
    bars = rows.table("bars")
    b = bars[bars["bar"].str.startswith(ROOFLINE_BAR)] if len(bars) else bars
    if b.empty:
        return NotMeasurable("kernels.divide_roofline", "no divide-vs-copy bar in the result")
    r = b.iloc[0]
    if r["verdict"] not in JUDGED:
        return NotMeasurable("kernels.divide_roofline", str(r["note"]) or "bar not applicable")
    at = r["verdict"] == Verdict.PASS
    where = "at the copy roofline" if at else "below the copy roofline"
    return Finding(
        "kernels.divide_roofline",
        f"the vec16 divide kernel runs {where} ({r['ratio']:.2f} of a same-size copy: "
        f"{r['measured']:.4g} vs {r['reference']:.4g} {r['unit']})",
        {"ratio": float(r["ratio"]), "kernel": float(r["measured"]), "copy": float(r["reference"])},
        [rows.ref("bars", bar=r["bar"])],
        f"largest size, read+write counted; roofline when the ratio is >= {r['threshold']:g} "
        "(the bar's threshold)", bar=str(r["bar"]), claim=str(r["verdict"]))


RULES = [divide_roofline]
