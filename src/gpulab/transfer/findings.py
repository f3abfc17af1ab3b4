"""Findings of the transfer stage (rules: see gpulab.findings)."""
from __future__ import annotations

from gpulab.findings import Finding, NotMeasurable, Rows, energy_rule

NO_GPU = "host <-> device copies need a CUDA GPU (this host ran on CPU virtual devices)"


def pinned_vs_pageable(rows: Rows):
    """Pinned vs pageable host memory, per direction, async copies at the largest size, GPU 0."""
    df = rows.table("host_device")
    if df.empty:
        return NotMeasurable("transfer.pinned_vs_pageable", NO_GPU)
    d = df[(df["call"] == "async") & (df["device"] == df["device"].min())]
    d = d[d["bytes"] == d["bytes"].max()]
    out = []
    for direction, g in d.groupby("direction", sort=True):
        by = g.set_index("memory")
        if not {"pinned", "pageable"} <= set(by.index):
            continue
        pin, page = float(by.loc["pinned", "value_median"]), float(by.loc["pageable", "value_median"])
        n = int(g["bytes"].iloc[0])
        x = pin / page
        verb = f"moves data {x:.1f}x faster than" if x >= 1 else f"is {1 / x:.1f}x slower than"
        out.append(Finding(
            "transfer.pinned_vs_pageable",
            f"pinned host memory {verb} pageable on this host ({pin:.1f} vs {page:.1f} GB/s, "
            f"{direction}, {n / 2**30:g} GiB)",
            {"pinned_GBps": pin, "pageable_GBps": page, "speedup": x},
            [rows.ref("host_device", direction=direction, memory=m, call="async",
                      device=int(g["device"].iloc[0]), bytes=n) for m in ("pinned", "pageable")],
            "cudaMemcpyAsync, median over repetitions, largest size of the sweep, GPU 0"))
    return out or NotMeasurable("transfer.pinned_vs_pageable", "no pinned/pageable pair measured")


def copy_energy(rows: Rows):
    """J/GB of the same-device copy (read+write counted), from the energy table."""
    return energy_rule("transfer.copy_energy", rows, "GB")


RULES = [pinned_vs_pageable, copy_energy]
