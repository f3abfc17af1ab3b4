"""Strong scaling from the measured rows: speedup and efficiency; a P not measured is a
not_applicable row of the result, never a table row with a status string."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd

from gpulab.outcomes import Bar, NotApplicable, Verdict

KEYS = ["M", "N", "K", "dtype"]


def table(single: pd.DataFrame, multi: pd.DataFrame) -> pd.DataFrame:
    """One row per measured (transport, algorithm, size, dtype, P).

    speedup = T_single / T_P with T_single the single-device baseline of the same size and dtype;
    efficiency = speedup / P; efficiency_vs_p1 = T_1 / (P * T_P) against the algorithm's own P=1.
    A P that was not measured is no row here but a not_applicable row of the result
    (:func:`unmeasured`, and the runner's P beyond the devices present), with its reason.
    """
    base = {tuple(r[k] for k in KEYS): r["time_s_median"] for _, r in single.iterrows()}
    rows = []
    if multi.empty:
        return pd.DataFrame(rows)
    for (transport, algorithm, *key), grp in multi.groupby(["transport", "algorithm", *KEYS],
                                                           sort=False):
        by_p = {int(r["P"]): r for _, r in grp.iterrows()}
        t1 = by_p[1]["time_s_median"] if 1 in by_p else math.nan
        t_single = base.get(tuple(key), math.nan)
        for p in sorted(by_p):
            t = by_p[p]["time_s_median"]
            rows.append({"transport": transport, "algorithm": algorithm, **dict(zip(KEYS, key)),
                         "P": p, "time_s": t, "tflops": by_p[p]["tflops_median"],
                         "speedup": t_single / t, "efficiency": t_single / (p * t),
                         "efficiency_vs_p1": t1 / (p * t), "error_ok": _error_ok(by_p[p])})
    return pd.DataFrame(rows)


def unmeasured(multi: pd.DataFrame, ranks: list[int], n_devices: int) -> list[NotApplicable]:
    """The P within the devices present that a launch asked for and gave no row of (a failed or
    cut launch: its crash is a check of its own), one per (transport, algorithm, P)."""
    wanted = sorted({int(p) for p in ranks if int(p) <= n_devices})
    out = []
    if multi.empty:
        return out
    for (transport, algorithm), grp in multi.groupby(["transport", "algorithm"], sort=False):
        if transport == "nccl_p2p_off":  # measured at the largest P only, by design
            continue
        have = {int(p) for p in grp["P"]}
        out += [NotApplicable(f"strong scaling {transport} {algorithm} P={p}",
                              "not run: the launch gave no row for it")
                for p in wanted if p not in have]
    return out


def _error_ok(row) -> bool:
    """The row's float64 error check passed (rows without one, e.g. old tables, count as passed)."""
    if "rel_error" not in row or "bound" not in row:
        return True
    e, b = float(row["rel_error"]), float(row["bound"])
    return math.isfinite(e) and abs(e) <= b


# Efficiency = speed-up / P. SUMMA on NVLink keeps large GEMMs compute-bound; below one half, the
# extra devices buy less than the communication costs.
EFFICIENCY_THRESHOLD = 0.5
BAR_ALGORITHM = "summa"  # the algorithm the bar judges; the others are in the scaling table
SOURCE = "the same GEMM (M x N x K, dtype) on one device, same run (table single); ideal: P"


def bars(scal: pd.DataFrame, kind: str, world: int, ranks: list[int] | None = None) -> list[Bar]:
    """Per precision: the speed-up of BAR_ALGORITHM (else the first algorithm configured) at the
    largest P and size, over NCCL.

    A fixed, named algorithm, never the fastest of those run (issue 24: taking the best of several
    makes noise look like a pass); a run whose output failed its float64 check fails its bar (a fast
    wrong answer is not a speed-up). ``ranks``: the P values asked for (none > 1: none asked).
    """
    name = "multi-device GEMM speed-up vs one device"
    if kind != "cuda":
        return [Bar.not_applicable(
            name,
            "CPU virtual devices share the host's cores: a speed-up over one of them measures the "
            "core split, not added hardware", unit="x", threshold=EFFICIENCY_THRESHOLD)]
    if ranks is not None and not any(int(p) > 1 for p in ranks):
        return [Bar.not_applicable(name, f"gemm.ranks asks for no P > 1 ({list(ranks)}): no "
                                         "multi-device run was asked", unit="x",
                                   threshold=EFFICIENCY_THRESHOLD)]
    if world < 2:
        return [Bar.not_applicable(name, f"needs >= 2 GPUs ({world} here)", unit="x",
                                   threshold=EFFICIENCY_THRESHOLD)]
    ran = scal[(scal["transport"] == "nccl") & (scal["P"] > 1)] if len(scal) else scal
    if ran.empty:
        return [Bar.not_applicable(name, "no multi-device run over NCCL with P > 1", unit="x")]
    p = int(ran["P"].max())
    ran = ran[ran["P"] == p]
    work = ran["M"].astype(float) * ran["N"] * ran["K"]
    ran = ran[work == work.max()]
    out = []
    for dtype, grp in ran.groupby("dtype", sort=False):
        algs = list(dict.fromkeys(grp["algorithm"]))
        algorithm = BAR_ALGORITHM if BAR_ALGORITHM in algs else algs[0]
        row = grp[grp["algorithm"] == algorithm].iloc[0]
        size = f"{row['M']}x{row['N']}x{row['K']}"
        bar = Bar.measure(f"multi-device GEMM {dtype} {size} on {p} GPUs ({algorithm}): speed-up "
                          "vs one GPU", row["speedup"], p, source=SOURCE,
                          threshold=EFFICIENCY_THRESHOLD, unit="x",
                          note=f"algorithm: {algorithm} (the fixed bar algorithm, not the fastest "
                               "of those run); ratio = efficiency = speed-up / P")
        if not bool(row.get("error_ok", True)):
            bar = dataclasses.replace(bar, verdict=Verdict.FAIL.value,
                                      note=f"{algorithm}: output failed its float64 error check, "
                                           "so its time is no speed-up")
        out.append(bar)
    return out
