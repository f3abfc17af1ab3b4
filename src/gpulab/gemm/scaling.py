"""Strong scaling from the measured rows: speedup and efficiency, with N/A rows for missing P."""
from __future__ import annotations

import math

import pandas as pd

from gpulab.outcomes import Bar

KEYS = ["M", "N", "K", "dtype"]


def table(single: pd.DataFrame, multi: pd.DataFrame, ranks: list[int], n_devices: int) -> pd.DataFrame:
    """One row per (transport, algorithm, size, dtype, P).

    speedup = T_single / T_P with T_single the single-device baseline of the same size and dtype;
    efficiency = speedup / P; efficiency_vs_p1 = T_1 / (P * T_P) against the algorithm's own P=1.
    P beyond the devices present appears with status 'not applicable'.
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
        wanted = sorted(set(ranks) | set(by_p)) if transport != "nccl_p2p_off" else sorted(by_p)
        for p in wanted:
            row = {"transport": transport, "algorithm": algorithm, **dict(zip(KEYS, key)), "P": p}
            if p in by_p:
                t = by_p[p]["time_s_median"]
                row.update(time_s=t, tflops=by_p[p]["tflops_median"], speedup=t_single / t,
                           efficiency=t_single / (p * t), efficiency_vs_p1=t1 / (p * t),
                           status="measured")
            else:
                row.update(time_s=math.nan, tflops=math.nan, speedup=math.nan,
                           efficiency=math.nan, efficiency_vs_p1=math.nan,
                           status=f"not applicable: {n_devices} device(s) available"
                           if p > n_devices else "not run")
            rows.append(row)
    return pd.DataFrame(rows)


UNITS = {"M": "elements", "N": "elements", "K": "elements", "P": "devices",
         "efficiency_vs_p1": "1"}

# Efficiency = speed-up / P. SUMMA on NVLink keeps large GEMMs compute-bound; below one half, the
# extra devices buy less than the communication costs.
EFFICIENCY_THRESHOLD = 0.5
SOURCE = "the same GEMM (M x N x K, dtype) on one device, same run (table single); ideal: P"


def bars(scal: pd.DataFrame, kind: str, world: int) -> list[Bar]:
    """Per precision: the best algorithm's speed-up at the largest P and size, over NCCL."""
    if kind != "cuda":
        return [Bar.not_applicable(
            "multi-device GEMM speed-up vs one device",
            "CPU virtual devices share the host's cores: a speed-up over one of them measures the "
            "core split, not added hardware", unit="x", threshold=EFFICIENCY_THRESHOLD)]
    if world < 2:
        return [Bar.not_applicable("multi-device GEMM speed-up vs one device",
                                   f"needs >= 2 GPUs ({world} here)", unit="x",
                                   threshold=EFFICIENCY_THRESHOLD)]
    ran = scal[(scal["status"] == "measured") & (scal["transport"] == "nccl") & (scal["P"] > 1)] \
        if len(scal) else scal
    if ran.empty:
        return [Bar.not_applicable("multi-device GEMM speed-up vs one device",
                                   "no multi-device run over NCCL with P > 1", unit="x")]
    p = int(ran["P"].max())
    ran = ran[ran["P"] == p]
    work = ran["M"].astype(float) * ran["N"] * ran["K"]
    ran = ran[work == work.max()]
    out = []
    for dtype, grp in ran.groupby("dtype", sort=False):
        best = grp.loc[grp["speedup"].idxmax()] if grp["speedup"].notna().any() else grp.iloc[0]
        size = f"{best['M']}x{best['N']}x{best['K']}"
        out.append(Bar.measure(f"multi-device GEMM {dtype} {size} on {p} GPUs: speed-up vs one GPU",
                               best["speedup"], p, source=SOURCE,
                               threshold=EFFICIENCY_THRESHOLD, unit="x",
                               note=f"best algorithm: {best['algorithm']}; ratio = efficiency = "
                                    "speed-up / P"))
    return out
