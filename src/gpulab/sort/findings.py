"""Findings of the sort stage (rules: see gpulab.findings)."""
from __future__ import annotations

from gpulab.findings import Finding, NotMeasurable, Rows


def winner_by_key_count(rows: Rows):
    """Which multi-device sort is fastest (host to host, on the most devices) at which key count."""
    df = rows.table("runs")
    if df.empty:
        return NotMeasurable("sort.winner_by_key_count", "no runs table in the sort result")
    d = df[(df["sweep"] == "size") & (df["scope"] == "host-to-host")]
    d = d[d["devices"] == d["devices"].max()]
    if d.empty or d["algorithm"].nunique() < 2:
        return NotMeasurable("sort.winner_by_key_count", "fewer than two multi-device sorts measured")
    best = d.loc[d.groupby("n_keys")["time_s_median"].idxmin()].sort_values("n_keys")
    spans, refs = [], []
    for r in best.itertuples():
        refs.append(rows.ref("runs", sweep="size", scope="host-to-host", devices=int(r.devices),
                             n_keys=int(r.n_keys), algorithm=r.algorithm, key_type=r.key_type,
                             distribution=r.distribution))
        if spans and spans[-1][0] == r.algorithm:
            spans[-1][2] = int(r.n_keys)
        else:
            spans.append([r.algorithm, int(r.n_keys), int(r.n_keys)])
    parts = [f"{a} at {lo:,} keys" if lo == hi else f"{a} from {lo:,} to {hi:,} keys"
             for a, lo, hi in spans]
    n = int(best["devices"].iloc[0])
    return Finding(
        "sort.winner_by_key_count",
        f"fastest sort on {n} device(s), host to host: " + "; ".join(parts),
        {f"keys_per_s_{int(r.n_keys)}": float(r.keys_per_s) for r in best.itertuples()},
        refs, "median time host to host (H2D, sort, D2H) per key count; every output verified")


RULES = [winner_by_key_count]
