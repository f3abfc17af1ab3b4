"""Turn the ranks' raw rows into the stage's tables: per-case statistics, samples, bars.

A repetition's time is the slowest rank's (the collective is done when its last rank is); median,
min and max are over repetitions. algbw and busbw follow nccl-tests (see formulas).
"""
from __future__ import annotations

import math

import pandas as pd

from gpulab import timing
from gpulab.collectives import formulas

LIBRARY_LABEL = "library"
UNITS = {"bytes": "B", "count": "elements", "time_s_median": "s", "time_s_min": "s",
         "time_s_max": "s", "algbw_GBps": "GB/s", "busbw_GBps": "GB/s", "busbw_GBps_min": "GB/s",
         "busbw_GBps_max": "GB/s", "wrong": "elements", "world_size": "ranks", "iters": "calls"}
SAMPLE_UNITS = {"bytes": "B", "time_s": "s", "repetition": "index"}
BAR_COLUMNS = ["bar", "measured", "reference", "ratio", "threshold", "passed", "unit", "note"]


def merge_ranks(rank_results: list[dict]) -> list[dict]:
    """One row per case: per-repetition max over ranks, wrong elements summed over ranks.

    The ranks given are this node's; the world size (which the busbw factor needs) is the one the
    ranks report, which spans every node of a multi-node job.
    """
    n = int(rank_results[0].get("world_size", len(rank_results)))
    per_rank = [r["rows"] for r in rank_results]
    if len({len(rows) for rows in per_rank}) != 1:
        raise RuntimeError("ranks returned different numbers of cases: "
                           f"{[len(rows) for rows in per_rank]}")
    merged = []
    for rows in zip(*per_rank):
        first = rows[0]
        keys = [(r["op"], r["mode"], r["bytes"]) for r in rows]
        if len(set(keys)) != 1:
            raise RuntimeError(f"ranks disagree on the case order: {keys}")
        samples = [max(vals) for vals in zip(*(r["samples"] for r in rows))]
        merged.append({**{k: v for k, v in first.items() if k != "samples"},
                       "world_size": n, "wrong": sum(int(r["wrong"]) for r in rows),
                       "samples": samples})
    return merged


def stats_row(row: dict) -> dict:
    st = timing.summarize(row["samples"])
    n, op, size = row["world_size"], row["op"], row["bytes"]
    out = {k: v for k, v in row.items() if k != "samples"}
    out.update({"time_s_median": st.median, "time_s_min": st.min, "time_s_max": st.max,
                "repeats": st.n,
                "algbw_GBps": formulas.algbw(size, st.median),
                "busbw_GBps": formulas.busbw(op, n, size, st.median),
                "busbw_GBps_min": formulas.busbw(op, n, size, st.max),
                "busbw_GBps_max": formulas.busbw(op, n, size, st.min),
                "bus_factor": formulas.bus_factor(op, n),
                "verified": row["wrong"] == 0})
    return out


def tables(merged: list[dict]) -> dict[str, pd.DataFrame]:
    """library: every library case; allreduce_algorithms: hand-written all-reduces next to the
    library's (in-place) all-reduce at the same sizes; samples: every repetition."""
    stats = pd.DataFrame([stats_row(r) for r in merged])
    out = {}
    lib = stats[stats["kind"] == "library"].drop(columns=["kind", "slices"], errors="ignore")
    out["library"] = lib.reset_index(drop=True)
    hand = stats[stats["kind"] == "handwritten"]
    if not hand.empty:
        ref = lib[(lib["op"] == "all_reduce") & (lib["mode"] == "in-place")].copy()
        ref["algorithm"] = LIBRARY_LABEL
        hand = hand.assign(algorithm=hand["op"])
        algs = pd.concat([ref, hand.drop(columns=["kind"])], ignore_index=True)
        cols = ["algorithm"] + [c for c in algs.columns if c not in ("algorithm", "op", "mode")]
        out["allreduce_algorithms"] = algs[cols]
    out["samples"] = pd.DataFrame([
        {"kind": r["kind"], "op": r["op"], "mode": r["mode"], "bytes": r["bytes"],
         "repetition": i, "time_s": t}
        for r in merged for i, t in enumerate(r["samples"])])
    return out


def _busbw_at(df: pd.DataFrame, col: str, name: str, size: int) -> float:
    hit = df[(df[col] == name) & (df["bytes"] == size)]
    return float(hit["busbw_GBps"].iloc[0]) if len(hit) else math.nan


def bar_row(bar, measured, reference, threshold, unit, note, applicable=True) -> dict:
    ratio = measured / reference if reference and reference > 0 and not math.isnan(reference) \
        else math.nan
    if not applicable:
        passed = "not applicable"
    elif math.isnan(ratio):
        passed = "not available"
    else:
        passed = "yes" if ratio >= threshold else "no"
    return {"bar": bar, "measured": measured, "reference": reference, "ratio": ratio,
            "threshold": threshold, "passed": passed, "unit": unit, "note": note}


def bars(algs: pd.DataFrame | None, device_kind: str, n: int, nccl_ref: float | None,
         nccl_note: str) -> pd.DataFrame:
    """The issue's two bars at the largest size measured (the issue names 1 GiB)."""
    if algs is None or algs.empty:
        return pd.DataFrame(columns=BAR_COLUMNS)
    size = int(algs["bytes"].max())
    lib = _busbw_at(algs, "algorithm", LIBRARY_LABEL, size)
    ring = _busbw_at(algs, "algorithm", "ring", size)
    where = f"at {size} B ({size / 2**30:g} GiB)"
    if device_kind != "cuda":
        why, ok = "bar defined for > 1 GPU; CPU (gloo) values shown for information", False
    elif n < 2:
        why, ok = "world size 1: no communication, busbw is 0 by definition", False
    else:
        why, ok = "", True
    return pd.DataFrame([
        bar_row("library all-reduce busbw within 5% of nccl-tests all_reduce_perf (in-place)",
                lib, nccl_ref if nccl_ref is not None else math.nan, 0.95, "GB/s",
                "; ".join(x for x in (where, why or nccl_note) if x), applicable=ok),
        bar_row("hand-written ring all-reduce busbw >= 70% of the library all-reduce",
                ring, lib, 0.70, "GB/s", "; ".join(x for x in (where, why) if x), applicable=ok),
    ], columns=BAR_COLUMNS)
