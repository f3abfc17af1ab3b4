"""Per-rank worker rows -> the result tables: aggregation over ranks, scaling efficiency, bars."""
from __future__ import annotations

import pandas as pd

from gpulab.train import loop

BAR_COLUMNS = ["bar", "measured", "reference", "ratio", "threshold", "passed", "unit", "note"]
BAR_UNITS = {"measured": "see unit", "reference": "see unit", "ratio": "1", "threshold": "see note"}


def units_for(df: pd.DataFrame, extra: dict | None = None) -> dict:
    u = {**loop.UNITS, "bucket_cap_mb": "MB", "comm_exposed_s": "s", "backward_nosync_s": "s",
         "stage_fb_s": "s", "busy_s": "s", "bubble_measured": "1", "bubble_gpipe": "1",
         "grad_rel_err": "1", "loss_rel_err": "1", "micro_batch": "samples", "microbatches": "count",
         "stages": "count", "speedup": "1", "params_local": "count", "value": "1",
         "tolerance": "1", "epoch": "count", **(extra or {})}
    return {c: u[c] for c in df.columns if c in u}


def slowest_rank(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per configuration: the slowest rank's timings (a synchronous step waits for it),
    the largest peak memory of any rank, and the number of ranks."""
    idx = df.groupby(keys, dropna=False)["step_s_median"].idxmax()
    out = df.loc[idx].drop(columns=["rank"]).reset_index(drop=True)
    peak = df.groupby(keys, dropna=False)["peak_mem_bytes"].max().reset_index()
    return out.drop(columns=["peak_mem_bytes"]).merge(peak, on=keys)


def ddp_table(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    keys = ["sweep", "model", "devices", "local_batch", "global_batch", "bucket_cap_mb", "comm_hook"]
    agg = slowest_rank(df, keys)
    agg["samples_per_s"] = agg["global_batch"] / agg["step_s_median"]
    agg["efficiency"] = float("nan")
    for i, r in agg.iterrows():
        if r["sweep"] == "comm":
            continue
        same = (agg["sweep"] == r["sweep"]) & (agg["model"] == r["model"]) & (agg["devices"] == 1)
        same &= (agg["global_batch"] == r["global_batch"]) if r["sweep"] == "strong" else \
            (agg["local_batch"] == r["local_batch"])
        base = agg[same]
        if len(base):
            agg.loc[i, "efficiency"] = loop.scaling_efficiency(
                r["samples_per_s"], int(r["devices"]), float(base["samples_per_s"].iloc[0]))
    return agg.sort_values(keys).reset_index(drop=True)


def bar(name, measured, reference, threshold, passed, unit, note) -> dict:
    ratio = measured / reference if reference not in (0, None) and measured == measured else float("nan")
    return {"bar": name, "measured": float(measured), "reference": float(reference), "ratio": ratio,
            "threshold": float(threshold), "passed": passed, "unit": unit, "note": note}


def not_applicable(name, unit, why) -> dict:
    return {"bar": name, "measured": float("nan"), "reference": float("nan"), "ratio": float("nan"),
            "threshold": float("nan"), "passed": "n/a", "unit": unit, "note": why}


def multi_gpu_reason(kind: str, n: int) -> str | None:
    if kind != "cuda":
        return "needs GPUs (CPU virtual devices share the same cores)"
    if n < 2:
        return "needs at least 2 GPUs (1 visible)"
    return None


def ddp_bars(agg: pd.DataFrame, kind: str, n: int) -> pd.DataFrame:
    out, why = [], multi_gpu_reason(kind, n)
    for sweep, thr in (("weak", 0.8), ("strong", 0.6)):
        name = f"DDP {sweep}-scaling efficiency on {n} devices"
        sel = agg[(agg["sweep"] == sweep) & (agg["devices"] == n) & agg["efficiency"].notna()]
        if why or sel.empty:
            out.append(not_applicable(name, "1", why or "no configuration ran at this count"))
            continue
        best = sel.loc[sel["efficiency"].idxmax()]
        e = float(best["efficiency"])
        out.append(bar(name, e, 1.0, thr, "pass" if e >= thr else "fail", "1",
                       f"threshold: efficiency >= {thr}; best of models/batches "
                       f"({best['model']}, global batch {int(best['global_batch'])})"))
    return pd.DataFrame(out, columns=BAR_COLUMNS)


def pipeline_tables(rows: list[dict], cfg: dict, kind: str, p: int):
    df = pd.DataFrame(rows)
    keys = ["schedule", "stages", "microbatches", "global_batch", "micro_batch"]
    ran = df[df["note"] == ""] if "step_s_median" in df else df.iloc[0:0]
    skipped = df[df["note"] != ""].drop_duplicates(keys)[keys + ["note"]]
    if len(ran):
        agg = slowest_rank(ran, keys)
        g = ran.groupby(keys)
        # Bubble: mean over ranks of each rank's idle share; errors: worst rank; loss: last stage.
        agg = agg.drop(columns=["bubble_measured", "grad_rel_err", "loss_rel_err", "loss"]).merge(
            g.agg(bubble_measured=("bubble_measured", "mean"), grad_rel_err=("grad_rel_err", "max"),
                  loss_rel_err=("loss_rel_err", "max"), loss=("loss", "max")).reset_index(), on=keys)
    else:
        agg = pd.DataFrame(columns=keys)
    agg = pd.concat([agg, skipped], ignore_index=True).sort_values(keys).reset_index(drop=True)
    tol = cfg["float32_tolerance"]
    checks = [{"check": f"pipeline {r.schedule} m={r.microbatches} == unsplit (grads, loss; "
                        "float32)", "value": max(r.grad_rel_err, r.loss_rel_err), "tolerance": tol,
               "passed": bool(max(r.grad_rel_err, r.loss_rel_err) <= tol)}
              for r in agg.itertuples() if r.note == ""]
    why = multi_gpu_reason(kind, p)
    name = "pipeline bubble vs GPipe (p-1)/(m+p-1), GPipe schedule, largest m"
    gp = agg[(agg["schedule"] == "gpipe")] if "bubble_measured" in agg else agg.iloc[0:0]
    if why or gp.empty:
        bars = [not_applicable(name, "1", why or "no GPipe run")]
    else:
        r = gp.loc[gp["microbatches"].idxmax()]
        diff = abs(r["bubble_measured"] - r["bubble_gpipe"])
        bars = [bar(name, r["bubble_measured"], r["bubble_gpipe"], 0.10,
                    "pass" if diff <= 0.10 else "fail", "1",
                    f"threshold: |measured - formula| <= 0.10 at p={p}, m={int(r['microbatches'])}")]
    return agg, checks, pd.DataFrame(bars, columns=BAR_COLUMNS)


def tensor_tables(rows: list[dict], rank_checks: list[dict], cfg: dict, kind: str, n: int):
    df = pd.DataFrame(rows)
    keys = ["mode", "devices", "global_batch"]
    agg = slowest_rank(df, keys)
    params = df.groupby(keys)["params_local"].max().reset_index()
    agg = agg.drop(columns=["params_local"]).merge(params, on=keys)
    base = agg[agg["mode"] == "unsplit"].set_index("global_batch")["step_s_median"]
    agg["speedup"] = [base.get(b, float("nan")) / s for b, s in zip(agg["global_batch"], agg["step_s_median"])]
    tol = cfg["float32_tolerance"]
    err = max(max(c["grad_rel_err"], c["loss_rel_err"]) for c in rank_checks)
    checks = [{"check": f"tensor parallel on {n} rank(s) == unsplit (full grads, loss; float32)",
               "value": err, "tolerance": tol, "passed": bool(err <= tol)}]
    why = multi_gpu_reason(kind, n)
    name = f"tensor-parallel speedup on {n} devices (largest batch)"
    tp = agg[agg["mode"] == "tensor_parallel"]
    if why:
        bars = [not_applicable(name, "1", why)]
    else:
        r = tp.loc[tp["global_batch"].idxmax()]
        ratio = r["speedup"] / n
        bars = [bar(name, r["speedup"], n, 0.5, "pass" if ratio >= 0.5 else "fail", "x",
                    "threshold: speedup / devices >= 0.5 (reference: linear speedup)")]
    return agg.sort_values(keys).reset_index(drop=True), checks, pd.DataFrame(bars, columns=BAR_COLUMNS)
