"""Rows of the ``bars`` table: a measured figure against a reference and a threshold on the ratio."""
from __future__ import annotations

import math

BAR_COLUMNS = ["bar", "measured", "reference", "ratio", "threshold", "passed", "unit", "note"]


def bar(name: str, measured, reference, threshold, unit: str, note: str = "") -> dict:
    """``passed`` is 'True'/'False' when there is a reference and threshold, else 'n/a'.

    ratio = measured / reference; passed = ratio >= threshold. Missing values are NaN.
    """
    m = float("nan") if measured is None else float(measured)
    ref = float("nan") if reference is None else float(reference)
    ratio = m / ref if ref and not math.isnan(ref) and not math.isnan(m) else float("nan")
    thr = float("nan") if threshold is None else float(threshold)
    passed = "n/a" if math.isnan(ratio) or math.isnan(thr) else str(bool(ratio >= thr))
    return {"bar": name, "measured": m, "reference": ref, "ratio": ratio, "threshold": thr,
            "passed": passed, "unit": unit, "note": note}
