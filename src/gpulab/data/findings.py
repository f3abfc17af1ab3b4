"""Findings of the data stage (rules: see gpulab.findings)."""
from __future__ import annotations

from gpulab.findings import Finding, NotMeasurable, Rows


def hdf5_vs_csv(rows: Rows):
    """Fastest HDF5 load vs fastest CSV load of the largest dataset that has both."""
    df = rows.table("loads")
    if df.empty:
        return NotMeasurable("data.hdf5_vs_csv", "no loads table in the data result")
    both = [ds for ds, g in df.groupby("dataset") if {"h5", "csv"} <= set(g["format"])]
    if not both:
        return NotMeasurable("data.hdf5_vs_csv", "no dataset was loaded from both HDF5 and CSV")
    d = df[df["dataset"].isin(both)]
    ds = d.loc[d["rows"].idxmax(), "dataset"]
    g = d[d["dataset"] == ds]
    h5 = g[g["format"] == "h5"].nsmallest(1, "load_s_median").iloc[0]
    csv = g[g["format"] == "csv"].nsmallest(1, "load_s_median").iloc[0]
    x = float(csv["load_s_median"]) / float(h5["load_s_median"])
    verb = f"{x:.1f}x faster than" if x >= 1 else f"{1 / x:.1f}x slower than"
    return Finding(
        "data.hdf5_vs_csv",
        f"HDF5 loads {verb} CSV at {int(h5['rows']):,} rows ({h5['method']} "
        f"{h5['load_s_median'] * 1e3:.3g} ms vs {csv['method']} {csv['load_s_median'] * 1e3:.3g} ms, "
        f"{ds})",
        {"h5_s": float(h5["load_s_median"]), "csv_s": float(csv["load_s_median"]), "speedup": x},
        [rows.ref("loads", dataset=ds, format=r["format"], method=r["method"]) for r in (h5, csv)],
        "whole-file load into memory, fastest method per format, median over repetitions")


RULES = [hdf5_vs_csv]
