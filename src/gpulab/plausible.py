"""Physical plausibility: no bandwidth or throughput may exceed its physical limit.

One rule for every stage (issue 24): a measured figure above ``TOLERANCE`` x its physical limit
(datasheet memory bandwidth, PCIe of the link, the NVLink share of a pair, the dense peak) was not
measured right (a timer around nothing, a copy that did not happen, bytes counted twice). It is a
failed check "exceeds the physical limit", and a bar that rests on it fails, so it can never read
as a headline result. The 5% tolerance covers boost clocks above the datasheet's and rounding in
the datasheet figures; nothing healthy comes near it (an H200 copy reaches 0.83 of HBM).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable

from gpulab.limits import Limit
from gpulab.outcomes import Bar, Check, Verdict

TOLERANCE = 1.05
CHECK = "within the physical limit"
EXCEEDS = "exceeds the physical limit"


def _finite(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def exceeds(measured, limit: float | None) -> bool:
    """True when ``measured`` is above TOLERANCE x a known, positive limit."""
    return _finite(measured) and _finite(limit) and float(limit) > 0 \
        and float(measured) > TOLERANCE * float(limit)


def check(case: str, measured, limit: Limit, unit: str = "") -> Check:
    """measured / limit against TOLERANCE: pass, fail ("exceeds the physical limit"), or
    not_applicable when the limit or the measurement is missing."""
    if not limit.known or not _finite(measured):
        why = limit.reason if not limit.known else "no measurement"
        return Check.of(CHECK, case, None, value=float("nan"), bound=TOLERANCE, note=why)
    ratio = float(measured) / float(limit.value)
    u = f" {unit}" if unit else ""
    if ratio > TOLERANCE:
        note = (f"{EXCEEDS}: {float(measured):.4g}{u} is {ratio:.2f} x {limit.value:.4g}{u} "
                f"({limit.source}); the timing or the byte count is wrong")
    else:
        note = f"measured / limit; limit {limit.value:.4g}{u} ({limit.source})"
    return Check.of(CHECK, case, ratio <= TOLERANCE, value=ratio, bound=TOLERANCE, note=note)


def guard(bar: Bar) -> tuple[Bar, Check]:
    """A bar whose reference is a physical limit, and its plausibility check; the bar fails when
    its measurement exceeds TOLERANCE x that limit (a pass above the limit is no pass)."""
    lim = Limit(bar.reference if _finite(bar.reference) and bar.reference > 0 else None, bar.unit,
                bar.source, bar.note or "no physical limit for this bar")
    c = check(bar.bar, bar.measured, lim, bar.unit)
    if c.verdict == Verdict.FAIL.value:
        bar = dataclasses.replace(bar, verdict=Verdict.FAIL.value, note=c.note)
    return bar, c


def guard_all(bars: Iterable[Bar]) -> tuple[list[Bar], list[Check]]:
    """:func:`guard` over bars against physical limits; checks only where a limit is known."""
    out, checks = [], []
    for b in bars:
        g, c = guard(b)
        out.append(g)
        if c.verdict != Verdict.NOT_APPLICABLE.value:
            checks.append(c)
    return out, checks


def row_checks(rows, value: str, limit_of: Callable[[dict], Limit], case_of: Callable[[dict], str],
               unit: str = "") -> list[Check]:
    """One check per table row (a DataFrame or dicts) whose physical limit is known."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows or [])
    out = []
    for r in records:
        lim = limit_of(r)
        if lim.known and _finite(r.get(value)):
            out.append(check(case_of(r), r[value], lim, unit))
    return out
