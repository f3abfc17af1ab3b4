"""Findings of the collectives stage (rules: see gpulab.findings)."""
from __future__ import annotations

from gpulab.findings import Finding, NotMeasurable, Rows
from gpulab.outcomes import JUDGED, Verdict

RING_BAR = "hand-written ring all-reduce busbw >= 70% of the library all-reduce"
RING_THRESHOLD = 0.7  # the ring bar's threshold (gpulab.collectives.assemble)


def _size(n: int) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n} B"


def ring_reaches_library(rows: Rows):
    """From which message size on the hand-written ring keeps >= the ring bar's threshold of the
    library's all-reduce busbw (every larger size too)."""
    df = rows.table("allreduce_algorithms")
    if df.empty or not {"ring", "library"} <= set(df["algorithm"]):
        return NotMeasurable("collectives.ring_reaches_library",
                             "no ring and library all-reduce measured side by side")
    bw = df.pivot_table(index="bytes", columns="algorithm", values="busbw_GBps", aggfunc="median")
    ratio = (bw["ring"] / bw["library"]).sort_index()
    ok = ratio >= RING_THRESHOLD
    # the smallest size from which every larger size reaches the threshold
    from_size = None
    for n in reversed(ratio.index):
        if not ok[n]:
            break
        from_size = n
    top = ratio.index.max()
    bars = rows.table("bars")
    b = bars[bars["bar"] == RING_BAR] if len(bars) else bars
    judged = len(b) and b["verdict"].iloc[0] in JUDGED
    claim = Verdict.of(ok[top]).value if judged else None
    if from_size is None:
        text = (f"the hand-written ring all-reduce stays below {RING_THRESHOLD:g} of the library "
                f"up to {_size(int(top))} ({ratio[top]:.2f} of its busbw there)")
    elif from_size == top:
        text = (f"the hand-written ring all-reduce reaches {RING_THRESHOLD:g} of the library only "
                f"at the largest size, {_size(int(top))} ({ratio[top]:.2f} of its busbw)")
    else:
        text = (f"the hand-written ring all-reduce reaches {RING_THRESHOLD:g} of the library from "
                f"{_size(int(from_size))} on ({ratio[from_size]:.2f} there, {ratio[top]:.2f} at "
                f"{_size(int(top))})")
    return Finding(
        "collectives.ring_reaches_library", text,
        {f"ratio_{int(n)}": float(v) for n, v in ratio.items()},
        [rows.ref("allreduce_algorithms", algorithm=a, bytes=int(n))
         for n in ratio.index for a in ("ring", "library")],
        f"in-place all-reduce busbw, median over repetitions, {int(df['world_size'].max())} ranks; "
        f"threshold {RING_THRESHOLD:g} as in the ring bar",
        bar=RING_BAR if judged else None, claim=claim)


RULES = [ring_reaches_library]
