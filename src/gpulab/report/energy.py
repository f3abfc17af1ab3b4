"""The figure "throughput vs energy efficiency": every resolved row of the stages' ``energy``
tables (gpulab.energy), one panel per kind of work (GB for copies, GFLOP for GEMM, samples)."""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt
import pandas as pd  # noqa: E402

from gpulab import results  # noqa: E402
from gpulab.kit.html import Figures, esc, note  # noqa: E402


def rows(files: list[Path]) -> pd.DataFrame:
    df = results.collect(files, "energy")
    if df.empty:
        return df
    return df[df["resolved"].astype(str).isin(["True", "true", "1"])]


def render(files: list[Path], figs: Figures) -> str:
    all_rows = results.collect(files, "energy")
    if all_rows.empty:
        return ""
    d = rows(files)
    if d.empty:
        why = sorted({str(n) for n in all_rows["note"] if str(n)})
        return note("Energy per operation: no resolved measurement here (" + esc("; ".join(why))
                    + ").")
    units = list(dict.fromkeys(d["work_unit"]))
    fig, axes = plt.subplots(1, len(units), figsize=(4.2 * len(units), 3.4), squeeze=False)
    for ax, unit in zip(axes[0], units):
        g = d[d["work_unit"] == unit]
        for r in g.itertuples():
            ax.scatter(r.throughput, r.efficiency, s=40)
            ax.annotate(f"{r.host} {r.device}: {r.avg_W:.0f} W", (r.throughput, r.efficiency),
                        fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel(f"throughput ({g['throughput_unit'].iloc[0]})")
        ax.set_ylabel(f"energy efficiency ({g['efficiency_unit'].iloc[0]})")
        ax.set_title(", ".join(sorted(set(g["operation"].str.split(",").str[0]))), fontsize=8)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    table = d[["host", "operation", "device", "meter", "duration_s", "energy_J", "avg_W",
               "throughput", "throughput_unit", "efficiency", "efficiency_unit", "per_op",
               "per_op_unit"]]
    return (figs.figure(fig, "Throughput vs energy efficiency: work per second against work per "
                             "joule, from the energy counter (NVML total energy on GPUs, RAPL on "
                             "CPUs) read around >= 1 s of back-to-back operations; labels give the "
                             "average power.")
            + figs.table(table, "Energy per operation (resolved rows; sample duration in "
                                "duration_s).", max_rows=50))
