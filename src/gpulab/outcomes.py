"""The one result vocabulary every stage and report section uses.

A stage states what it verified and how fast it was in three tables of the same shape everywhere:

- ``bars``: a measurement against a reference that comes from somewhere else (a datasheet limit,
  an independent tool, the same work on one device). :class:`Bar` rows.
- ``checks``: a correctness check of one case (sorted, sums match, error bound, the case ran).
  :class:`Check` rows. A crashed case is a failed check (:meth:`Check.crashed`).
- ``not_applicable``: what was not measured here, and why. :class:`NotApplicable` rows.

A section compares its figures with figures from elsewhere that carry no threshold in
:class:`Reference` rows (the report's comparison chapter).

Every verdict is one of exactly three values (:class:`Verdict`). The root attribute ``verdict`` of a
result file is the overall verdict (:func:`overall`): ``fail`` if any check or bar failed or any
case crashed, ``pass`` if something passed, ``not_applicable`` if nothing could be judged;
``verdict_counts`` (JSON) and ``verdict_summary`` ("132 judged (132 checks, 0 bars), 1 failed, 0
not applicable: 131 of 132 checks passed, 1 failed: ...") go beside it. :func:`gpulab.results.write` sets them, so no stage sets its own.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Iterable, Mapping

import pandas as pd

BARS, CHECKS, NOT_APPLICABLE = "bars", "checks", "not_applicable"


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "not_applicable"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, ok: bool | None) -> "Verdict":
        """pass/fail from a boolean; None (nothing to judge) is not_applicable."""
        if ok is None:
            return cls.NOT_APPLICABLE
        return cls.PASS if bool(ok) else cls.FAIL

    @classmethod
    def parse(cls, value) -> "Verdict":
        """A verdict read back from a table (strings only: the three values, nothing else)."""
        if isinstance(value, Verdict):
            return value
        try:
            return cls(str(value))
        except ValueError:
            raise ValueError(f"not a verdict: {value!r} (expected one of {[v.value for v in cls]})") from None


VERDICTS = tuple(v.value for v in Verdict)
# The verdicts that judged something (a bar or check that was not not_applicable).
JUDGED = (Verdict.PASS, Verdict.FAIL)


def combine(verdicts: Iterable[Verdict | str]) -> Verdict:
    """fail if any failed; else pass if any passed; else not_applicable."""
    vs = {Verdict.parse(v) for v in verdicts}
    if Verdict.FAIL in vs:
        return Verdict.FAIL
    if Verdict.PASS in vs:
        return Verdict.PASS
    return Verdict.NOT_APPLICABLE


def _finite(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


@dataclass
class Bar:
    """measured / reference against a threshold. ``source`` says where the reference comes from.

    ``direction`` '>=' passes when ratio >= threshold (throughput, efficiency); '<=' passes when
    ratio <= threshold (overheads, latencies, errors).
    """

    bar: str
    measured: float
    reference: float
    source: str
    threshold: float
    unit: str
    verdict: str = Verdict.NOT_APPLICABLE.value
    ratio: float = float("nan")
    direction: str = ">="
    note: str = ""

    @classmethod
    def measure(cls, bar: str, measured, reference, *, source: str, threshold: float, unit: str,
                direction: str = ">=", note: str = "") -> "Bar":
        """A bar judged from its numbers; a missing or non-positive reference is not_applicable."""
        if direction not in (">=", "<="):
            raise ValueError(f"bar {bar!r}: direction must be '>=' or '<=', not {direction!r}")
        if not source:
            raise ValueError(f"bar {bar!r}: every reference names its source")
        m = float(measured) if _finite(measured) else float("nan")
        r = float(reference) if _finite(reference) else float("nan")
        if not _finite(r) or r <= 0:
            return cls(bar, m, r, source, threshold, unit, Verdict.NOT_APPLICABLE.value,
                       float("nan"), direction, note or "no reference value for this device")
        if not _finite(m):
            # A measurement that should exist and does not is a failure, not a skip.
            return cls(bar, m, r, source, threshold, unit, Verdict.FAIL.value, float("nan"),
                       direction, note or "no valid measurement")
        ratio = m / r
        ok = ratio >= threshold if direction == ">=" else ratio <= threshold
        return cls(bar, m, r, source, threshold, unit, Verdict.of(ok).value, ratio, direction, note)

    @classmethod
    def not_applicable(cls, bar: str, reason: str, *, source: str = "", unit: str = "",
                       threshold: float = float("nan"), measured=float("nan")) -> "Bar":
        return cls(bar, float(measured) if _finite(measured) else float("nan"), float("nan"),
                   source, threshold, unit, Verdict.NOT_APPLICABLE.value, float("nan"), ">=", reason)


@dataclass
class Check:
    """One verified case: what was compared, the observed value, its bound, and the verdict."""

    check: str
    case: str
    verdict: str
    value: float = float("nan")
    bound: float = float("nan")
    note: str = ""

    @classmethod
    def of(cls, check: str, case: str, ok: bool | None, *, value=float("nan"), bound=float("nan"),
           note: str = "") -> "Check":
        return cls(check, str(case), Verdict.of(ok).value, float(value) if _finite(value) else float("nan"),
                   float(bound) if _finite(bound) else float("nan"), note)

    @classmethod
    def within(cls, check: str, case: str, value, bound, note: str = "") -> "Check":
        """pass when |value| <= bound (an error against an independent reference)."""
        ok = _finite(value) and abs(float(value)) <= float(bound)
        return cls.of(check, case, ok, value=value, bound=bound, note=note)

    @classmethod
    def crashed(cls, case: str, exc: BaseException | str) -> "Check":
        msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        return cls("ran", str(case), Verdict.FAIL.value, note=f"crashed: {msg}"[:500])


@dataclass
class NotApplicable:
    """Something this stage did not measure here, and why (one row)."""

    what: str
    reason: str


@dataclass
class Reference:
    """A measured figure beside a figure from elsewhere, with no threshold and so no verdict (the
    seed's RTX A5000 numbers, a datasheet limit, another tool): a row of a section's
    ``references``. ``fraction`` = measured / reference (:meth:`of`), or a bar's own ratio."""

    metric: str
    measured: float
    reference: float
    source: str
    fraction: float = float("nan")

    @classmethod
    def of(cls, metric: str, measured, reference, source: str) -> "Reference":
        m = float(measured) if _finite(measured) else float("nan")
        r = float(reference) if _finite(reference) else float("nan")
        return cls(metric, m, r, source, m / r if r != 0 else float("nan"))

    @classmethod
    def of_bar(cls, metric: str, bar) -> "Reference":
        """A bar row (a :class:`Bar` or a row of a ``bars`` table) as a reference, its ratio kept."""
        return cls(metric, bar.measured, bar.reference, bar.source, bar.ratio)


BAR_COLUMNS = [f.name for f in fields(Bar)]
CHECK_COLUMNS = [f.name for f in fields(Check)]
NOT_APPLICABLE_COLUMNS = [f.name for f in fields(NotApplicable)]
REFERENCE_COLUMNS = [f.name for f in fields(Reference)]


def _frame(rows, columns: list[str], cls) -> pd.DataFrame:
    out = []
    for r in rows:
        if isinstance(r, cls):
            out.append(asdict(r))
        elif isinstance(r, Mapping):
            out.append(dict(r))
        else:
            raise TypeError(f"expected {cls.__name__} rows, got {type(r).__name__}")
    df = pd.DataFrame(out, columns=columns)
    if "verdict" in df.columns:
        df["verdict"] = [Verdict.parse(v).value for v in df["verdict"]]
    return df


def bars_frame(rows: Iterable[Bar]) -> pd.DataFrame:
    return _frame(rows, BAR_COLUMNS, Bar)


def checks_frame(rows: Iterable[Check]) -> pd.DataFrame:
    return _frame(rows, CHECK_COLUMNS, Check)


def not_applicable_frame(rows: Iterable[NotApplicable]) -> pd.DataFrame:
    return _frame(rows, NOT_APPLICABLE_COLUMNS, NotApplicable)


def references_frame(rows: Iterable[Reference]) -> pd.DataFrame:
    return _frame(rows, REFERENCE_COLUMNS, Reference)


def overall(tables: Mapping[str, pd.DataFrame]) -> dict:
    """The result's overall verdict from its ``checks`` and ``bars`` tables.

    Returns ``{'verdict', 'counts', 'summary'}``. Crashed cases are checks named 'ran' that failed.
    The summary leads with what was judged ("3 judged (2 checks, 1 bar), 0 failed, 4 not
    applicable"), so a pass that judged no bar never reads like one that met its bars.
    """
    counts = {"checks": 0, "checks_failed": 0, "checks_not_applicable": 0, "crashed": 0, "bars": 0,
              "bars_failed": 0, "bars_not_applicable": 0, "not_applicable": 0}
    verdicts: list[Verdict] = []
    failed_what: list[str] = []
    checks = tables.get(CHECKS)
    if checks is not None and len(checks) and set(CHECK_COLUMNS) <= set(checks.columns):
        for _, row in checks.iterrows():
            v = Verdict.parse(row["verdict"])
            if v is Verdict.NOT_APPLICABLE:
                counts["checks_not_applicable"] += 1
                continue
            counts["checks"] += 1
            verdicts.append(v)
            if v is Verdict.FAIL:
                counts["checks_failed"] += 1
                if row["check"] == "ran":
                    counts["crashed"] += 1
                failed_what.append(f"{row['check']} [{row['case']}]")
    bars = tables.get(BARS)
    if bars is not None and len(bars) and set(BAR_COLUMNS) <= set(bars.columns):
        for _, row in bars.iterrows():
            v = Verdict.parse(row["verdict"])
            counts["bars"] += 1
            if v is Verdict.NOT_APPLICABLE:
                counts["bars_not_applicable"] += 1
                continue
            verdicts.append(v)
            if v is Verdict.FAIL:
                counts["bars_failed"] += 1
                failed_what.append(f"bar {row['bar']}")
    na = tables.get(NOT_APPLICABLE)
    counts["not_applicable"] = 0 if na is None else len(na)
    verdict = combine(verdicts)
    n, nf = counts["checks"], counts["checks_failed"]
    bars_judged = counts["bars"] - counts["bars_not_applicable"]
    counts["judged"] = n + bars_judged
    counts["failed"] = nf + counts["bars_failed"]
    n_na = counts["checks_not_applicable"] + counts["bars_not_applicable"] + counts["not_applicable"]
    head = (f"{counts['judged']} judged ({n} check{'s' * (n != 1)}, {bars_judged} "
            f"bar{'s' * (bars_judged != 1)}), {counts['failed']} failed, {n_na} not applicable")
    parts = [f"{n - nf} of {n} checks passed" if n else "no checks"]
    if nf:
        crashed = f" ({counts['crashed']} crashed)" if counts["crashed"] else ""
        parts[0] += f", {nf} failed{crashed}"
    if bars_judged:
        parts.append(f"{bars_judged - counts['bars_failed']} of {bars_judged} bars met"
                     + (f", {counts['bars_not_applicable']} not applicable" if counts["bars_not_applicable"] else ""))
    elif counts["bars"]:  # "0 of 0 bars met" read like a pass of the bars
        parts.append(f"no bar judged ({counts['bars_not_applicable']} not applicable)")
    else:
        parts.append("no bars")
    summary = head + ": " + "; ".join(parts)
    if failed_what:
        shown = ", ".join(failed_what[:5]) + (f" and {len(failed_what) - 5} more" if len(failed_what) > 5 else "")
        summary += f". Failed: {shown}"
    return {"verdict": verdict.value, "counts": counts, "summary": summary}


# The one units table: column name -> unit, for names the suffix rule (SUFFIX_UNITS) does not cover
# or covers wrongly. A statistic suffix (STATISTICS: time_s_median) keeps the unit of the column it
# summarises (time_s). See :func:`unit_of` for the order in which the rules apply.
UNITS: dict[str, str] = {
    # sizes, counts, indices
    "bytes": "B", "nbytes": "B", "bytes_per_value": "B/value", "bytes_per_sample": "B",
    "bytes_per_thread": "B", "bytes_moved": "B", "bytes_h2d": "B", "bytes_d2h": "B", "count": "elements", "wrong": "elements",
    "M": "elements", "N": "elements", "K": "elements", "P": "devices", "world_size": "ranks",
    "repeats": "count", "copies": "count", "calls": "count", "calls_per_sample": "count",
    "chunks": "count", "classes": "count", "devices": "count", "devices_used": "count",
    "host_gpus": "count", "histogram_passes": "count", "iterations": "count", "jobs": "count",
    "microbatches": "count", "stages": "count", "panels": "count", "params_local": "count",
    "round": "count", "samples": "count", "slices": "count", "step": "count", "epoch": "count",
    "threads": "count", "iters": "calls", "repetition": "index", "index": "index",
    "device": "index", "device_id": "index", "gpu": "index", "src": "index", "dst": "index",
    "rank": "index", "local_rank": "index", "node_rank": "index", "node": "index", "job": "index",
    "pid": "process id", "cuda_visible_devices": "device ids", "prior_from": "allocations", "prior_to": "allocations",
    "spin_timeouts": "samples", "rows": "samples", "first_batch_rows": "samples",
    "global_batch": "samples", "local_batch": "samples", "micro_batch": "samples",
    "values_per_row": "values", "n_keys": "keys", "keys_moved": "keys", "tie_keys": "keys",
    "pivot": "keys", "len_left": "keys", "len_right": "keys",
    "pcie_gen": "PCIe generation", "pcie_width": "lanes", "nvlinks": "links", "nvlinks_switch": "links",
    "nvlinks_unknown": "links",
    # rates
    "gbps": "GB/s", "tflops": "TFLOP/s", "keys_per_s": "keys/s", "gkeys_per_s": "Gkeys/s",
    "samples_per_s": "samples/s", "rows_per_s": "samples/s",
    # times that are not plain seconds
    "samples_s": "s per sample (JSON list)",
    # ratios and dimensionless figures
    "rel_error": "1", "ratio": "1", "threshold": "1", "efficiency": "1", "efficiency_vs_p1": "1",
    "speedup": "1", "fraction": "1", "fraction_of_copy": "1", "share": "1", "bus_factor": "1",
    "bound": "1", "value": "1", "tolerance": "1", "loss": "1", "final_loss": "1", "lr": "1",
    "bubble_measured": "1", "bubble_gpipe": "1", "overlap": "1", "spread": "(max-min)/median",
    "value_rw": "GB/s (read+write)",
    # flags
    "streaming": "bool", "from_cache": "bool", "resolved": "bool", "round_trip": "verdict",
    "max_concurrency": "jobs", "max_kernel_concurrency": "jobs", "mean_concurrency": "jobs",
    "temp_c": "degC",
}
# A column named <anything><suffix> (after its statistic suffix is taken off), first match wins.
SUFFIX_UNITS: tuple[tuple[str, str], ...] = (
    ("_bytes", "B"), ("_unix", "s (Unix time)"), ("_s", "s"), ("_ms", "ms"), ("_us", "us"),
    ("_GBps", "GB/s"), ("_gbps", "GB/s"), ("_MBps", "MB/s (10^6 B, file size)"), ("_tflops", "TFLOP/s"),
    ("_mb", "MB"), ("_mhz", "MHz"), ("_w", "W"), ("_W", "W"), ("_J", "J"), ("_devices", "count"),
    ("_fraction", "1"), ("_rel_err", "1"),
)
STATISTICS = ("_median", "_mean", "_min", "_max", "_stdev", "_now")
# Value columns whose unit is each row's 'unit' column (bars; transfer's mixed GB/s and us rows).
ROW_UNIT_COLUMNS = ("value", "measured", "reference")


def _base(column: str) -> str:
    for s in STATISTICS:
        if column.endswith(s) and len(column) > len(s):
            return column[: -len(s)]
    return column


def unit_of(column: str, columns=(), dtype=None) -> str | None:
    """The unit of ``column`` in a table with ``columns``, or None (a label: text, names).

    In this order: a sibling ``<column>_unit`` names it per row; a value column of a table with a
    ``unit`` column (:data:`ROW_UNIT_COLUMNS`) takes it per row; :data:`UNITS` by the name, then by
    the name without its statistic suffix; :data:`SUFFIX_UNITS`; a boolean column is "bool".
    """
    base = _base(column)
    if f"{column}_unit" in columns:
        return f"see column {column}_unit"
    if base in ROW_UNIT_COLUMNS and "unit" in columns:
        return "see column 'unit'"
    for name in (column, base):
        if name in UNITS:
            return UNITS[name]
    for suffix, unit in SUFFIX_UNITS:
        if base.endswith(suffix):
            return unit
    if dtype is not None and pd.api.types.is_bool_dtype(dtype):
        return "bool"
    return None


def units_for(df: pd.DataFrame, notes: Mapping[str, str] | None = None) -> dict[str, str]:
    """Units of ``df``'s columns (:func:`unit_of`). ``notes``: what a stage's column counts, by
    column name or by the name without its statistic suffix, added in brackets ("GB/s (read+write)")."""
    notes = notes or {}
    out = {}
    for c in df.columns:
        unit = unit_of(str(c), df.columns, df[c].dtype)
        if unit is None:
            continue
        note = notes.get(c, notes.get(_base(str(c))))
        out[c] = f"{unit} ({note})" if note else unit
    return out
