"""Turn the ranks' raw rows into the stage's tables: per-case statistics, samples, bars.

A repetition's time is the slowest rank's (the collective is done when its last rank is); median,
min and max are over repetitions. algbw and busbw follow nccl-tests (see formulas).
"""
from __future__ import annotations

import math

import pandas as pd

from gpulab import timing
from gpulab.collectives import formulas
from gpulab.outcomes import Bar, Check

LIBRARY_LABEL = "library"
# Stage-specific units beside gpulab.outcomes.UNITS.
EXTRA_UNITS = {"count": "elements", "time_s_median": "s", "time_s_min": "s", "time_s_max": "s",
               "algbw_GBps": "GB/s", "busbw_GBps": "GB/s", "busbw_GBps_min": "GB/s",
               "busbw_GBps_max": "GB/s", "wrong": "elements", "world_size": "ranks",
               "iters": "calls", "repetition": "index", "bus_factor": "1", "repeats": "count"}
# nccl-tests and torch.distributed differ in their process model (see the report's methods), so
# the library may land on either side of nccl-tests; 5% either way is the same figure.
NCCL_TESTS_TOLERANCE = 0.05
RING_THRESHOLD = 0.70


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


def checks(merged: list[dict], backend: str) -> list[Check]:
    """One check per case: every output element on every rank equal to the exact result."""
    return [Check.of("exact result on every rank", f"{backend} {r['kind']} {r['op']} {r['mode']} "
                     f"{r['bytes']} B", r["wrong"] == 0, value=r["wrong"], bound=0,
                     note="wrong elements summed over ranks (nccl-tests' #wrong)")
            for r in merged]


NCCL_BARS = ("library all-reduce busbw >= 95% of nccl-tests all_reduce_perf (in-place, median)",
             "library all-reduce busbw <= 105% of nccl-tests all_reduce_perf (in-place, median)")
RING_BAR = "hand-written ring all-reduce busbw >= 70% of the library all-reduce"


def bars(algs: pd.DataFrame | None, device_kind: str, n: int, nccl_ref: float | None,
         nccl_note: str) -> list[Bar]:
    """At the largest size measured: the library against nccl-tests (two-sided, as two bars) and
    the hand-written ring against the library."""
    if algs is None or algs.empty:
        return []
    size = int(algs["bytes"].max())
    lib = _busbw_at(algs, "algorithm", LIBRARY_LABEL, size)
    ring = _busbw_at(algs, "algorithm", "ring", size)
    where = f"at {size} B ({size / 2**30:g} GiB)"
    if device_kind != "cuda":
        why = "defined for > 1 GPU (NCCL); CPU (gloo) values are in the tables for information"
    elif n < 2:
        why = "world size 1: no communication, busbw is 0 by definition"
    else:
        why = ""
    if why:
        return [Bar.not_applicable(b, f"{why}; {where}", unit="GB/s", measured=m)
                for b, m in ((NCCL_BARS[0], lib), (NCCL_BARS[1], lib), (RING_BAR, ring))]
    src = f"nccl-tests all_reduce_perf, {nccl_note}" if nccl_note else "nccl-tests all_reduce_perf"
    out = []
    if nccl_ref is None:
        out += [Bar.not_applicable(b, nccl_note or "nccl-tests all_reduce_perf not run",
                                   unit="GB/s", measured=lib) for b in NCCL_BARS]
    else:
        note = (f"{where}; both sides the median over repetitions of the per-call time of a block "
                "of back-to-back calls; one process per GPU here, one process for all GPUs in "
                "nccl-tests")
        out += [Bar.measure(NCCL_BARS[0], lib, nccl_ref, source=src,
                            threshold=1 - NCCL_TESTS_TOLERANCE, unit="GB/s", note=note),
                Bar.measure(NCCL_BARS[1], lib, nccl_ref, source=src,
                            threshold=1 + NCCL_TESTS_TOLERANCE, unit="GB/s", direction="<=",
                            note=note)]
    out.append(Bar.measure(RING_BAR, ring, lib, source="library all-reduce (in place), same run",
                           threshold=RING_THRESHOLD, unit="GB/s", note=where))
    return out
