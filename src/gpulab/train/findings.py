"""Findings of the training stage (rules: see gpulab.findings)."""
from __future__ import annotations

from gpulab.findings import Finding, NotMeasurable, Rows, energy_rule


def best_comm_hook(rows: Rows):
    """Per model: which DDP gradient communication hook trains fastest, against none."""
    df = rows.table("ddp")
    d = df[df["sweep"] == "comm"] if len(df) and "sweep" in df.columns else df
    if d.empty or "comm_hook" not in d.columns or d["comm_hook"].nunique() < 2:
        return NotMeasurable("train.best_comm_hook", "no DDP communication-hook sweep in the "
                                                     "results (the ddp variant, >= 2 devices)")
    out = []
    keys = ["model", "devices", "local_batch", "bucket_cap_mb"]
    for ident, g in d.groupby(keys, sort=True):
        if "none" not in set(g["comm_hook"]):
            continue
        best = g.loc[g["samples_per_s"].idxmax()]
        base = g[g["comm_hook"] == "none"].iloc[0]
        x = float(best["samples_per_s"]) / float(base["samples_per_s"])
        model, devices, lb = ident[0], int(ident[1]), int(ident[2])
        text = (f"DDP with no communication hook is the fastest for {model} on {devices} devices"
                if best["comm_hook"] == "none" else
                f"the {best['comm_hook']} DDP hook trains {model} {x:.2f}x faster than no hook on "
                f"{devices} devices")
        out.append(Finding(
            "train.best_comm_hook",
            f"{text} ({best['samples_per_s']:.4g} vs {base['samples_per_s']:.4g} samples/s, "
            f"local batch {lb}, bucket {ident[3]:g} MB)",
            {"best_samples_per_s": float(best["samples_per_s"]),
             "none_samples_per_s": float(base["samples_per_s"]), "speedup": x},
            [rows.ref("ddp", sweep="comm", **dict(zip(keys, ident)), comm_hook=h)
             for h in dict.fromkeys([best["comm_hook"], "none"])],
            "median step time of the DDP communication sweep; the hooks compress gradients, so the "
            "final loss can differ (see the training section)"))
    return out or NotMeasurable("train.best_comm_hook", "no sweep with the 'none' baseline")


def train_energy(rows: Rows):
    """J per sample of a single-device training step, per model, from the energy table."""
    return energy_rule("train.train_energy", rows, "sample")


RULES = [best_comm_hook, train_energy]
