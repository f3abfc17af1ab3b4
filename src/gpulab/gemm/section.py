"""Multi-device GEMM: single-device baseline, 1D row / SUMMA / overlapped SUMMA, strong scaling."""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import pandas as pd  # noqa: E402

from gpulab import results  # noqa: E402
from gpulab.outcomes import Verdict  # noqa: E402
from gpulab.kit.frames import (BAR_SHOWN, bar_references, checks_summary,  # noqa: E402
                              collect_labelled, host_label)
from gpulab.kit.html import Figures, esc  # noqa: E402

TITLE = "Multi-device matrix multiplication (GEMM)"

METHODS = """
<p>C = A&nbsp;@&nbsp;B with A of M&times;K and B of K&times;N, random standard-normal inputs (the same
matrices on every rank). Work is counted as 2&middot;M&middot;N&middot;K floating-point operations;
TFLOP/s = 2MNK / time, padding for uneven splits (zero rows/columns) is never counted. Precisions:
<b>fp32</b> (TF32 off), <b>tf32</b> (fp32 storage, TF32 matrix units; CUDA only), <b>bf16</b>.
The single-device path is <code>torch.matmul(a, b, out=c)</code> (cuBLAS on GPU, oneDNN on CPU),
timed per call with CUDA events (host clock on CPU) after warm-up; medians with min/max over the
repetitions. <b>Bars</b>: per precision, the TFLOP/s at <code>bar_size</code>&sup3; as a fraction of
the GPU model's dense datasheet peak (<code>gpulab/limits.yaml</code>, with its source; not
applicable on CPU devices or an unknown model), and the multi-device speed-up against the same GEMM
on one device in the same run (ratio = efficiency = speed-up / P). The comparison of the call path
with plain <code>torch.matmul(a, b)</code> (batches of back-to-back calls) runs the same cuBLAS kernel
on both sides: it is a <b>harness overhead check</b> (gpulab's call path vs the raw library call,
same kernel), not a performance result.</p>
<p>Multi-device algorithms run one process per device (forked on one node; NCCL on GPUs, gloo on CPU virtual
devices, each a share of the cores). <b>row1d</b>: A and B start on rank 0; scatter row blocks of
A, broadcast B, local GEMM, gather C to rank 0 (all of it timed). <b>summa</b>: A, B, C
block-distributed on the most square grid rows&times;cols (1&times;2, 2&times;2, 2&times;3,
2&times;4); for each k panel the owners broadcast the A panel along grid rows and the B panel along
grid columns, and every rank adds the panel product into its block (data stay distributed; no
scatter/gather timed). <b>summa_overlap</b>: the same with two panel buffers, broadcasting panel
l+1 asynchronously while panel l is multiplied. A run's time is the slowest rank's, after a barrier;
compute is the time inside local GEMMs, communication = total &minus; compute (exposed
communication, including waiting). Strong scaling: speedup = T<sub>single</sub>/T<sub>P</sub>
against the single-device baseline of the same size and precision, efficiency = speedup/P;
efficiency vs P=1 uses the algorithm's own one-device time. The interconnect comparison reruns the
largest P with <code>NCCL_P2P_DISABLE=1</code> (NCCL then stages through host memory).</p>
<p>Every result is verified: relative Frobenius error &Vert;C&minus;C<sub>ref</sub>&Vert; /
&Vert;C<sub>ref</sub>&Vert; against a float64 product of the same (already rounded) inputs, within
fp32 1e-5, tf32 2e-3, bf16 1e-2 (fp16 2e-3).</p>
"""

PREC_ORDER = ["fp32", "tf32", "bf16", "fp16"]


def _host(a: dict) -> str:
    return host_label(a, "n_devices", cpu="CPU, {n} virtual devices", unnamed="?")


def _collect(files: list[Path], table: str) -> pd.DataFrame:
    return collect_labelled(files, table, _host)


def _size(df: pd.DataFrame) -> pd.Series:
    return df["M"].astype(str) + "x" + df["N"].astype(str) + "x" + df["K"].astype(str)


def _largest(df: pd.DataFrame) -> str:
    """The size (by flops) the multi-device figures show."""
    work = df["M"].astype(float) * df["N"] * df["K"]
    return df.loc[work.idxmax(), "size"]


def _single_figure(single: pd.DataFrame, figs: Figures) -> str:
    g = sns.catplot(data=single, kind="bar", x="size", y="tflops_median", hue="dtype",
                    col="host", hue_order=[p for p in PREC_ORDER if p in set(single["dtype"])],
                    height=3.2, aspect=1.5, sharey=False)
    g.set_axis_labels("M x N x K", "TFLOP/s (median)")
    for ax in g.axes.flat:
        ax.tick_params(axis="x", rotation=20)
    return figs.figure(g.figure, "Single-device GEMM throughput, torch.matmul(a, b, out=c), "
                                 "median TFLOP/s = 2MNK / time (min/max in the table below).")


def _multi_figure(multi: pd.DataFrame, single: pd.DataFrame, size: str, figs: Figures) -> str:
    d = multi[multi["size"] == size]
    g = sns.relplot(data=d, kind="line", x="P", y="tflops_median", hue="algorithm",
                    style="transport", col="dtype", row="host", markers=True, height=3,
                    aspect=1.2, facet_kws={"sharey": False})
    for (host, dtype), ax in g.axes_dict.items():  # row and col both set: (row, col) keys
        ref = single[(single["host"] == host) & (single["dtype"] == dtype) & (single["size"] == size)]
        if len(ref):
            ax.axhline(ref["tflops_median"].iloc[0], color="gray", ls=":", lw=1)
        ax.set_xticks(sorted(d["P"].unique()))
    g.set_axis_labels("devices P", "TFLOP/s (median)")
    return figs.figure(g.figure, f"Multi-device GEMM throughput at {size} against the device "
                                 "count P (dotted: single-device baseline). row1d includes "
                                 "scatter/gather from rank 0; SUMMA keeps data distributed.")


def _breakdown_figure(multi: pd.DataFrame, size: str, figs: Figures) -> str:
    d = multi[multi["size"] == size].copy()
    d["run"] = d["algorithm"] + " P=" + d["P"].astype(str) + " " + d["transport"]
    d["label"] = d["host"] + " / " + d["dtype"]
    labels = list(dict.fromkeys(d["label"]))
    fig, axes = plt.subplots(1, len(labels), figsize=(4.2 * len(labels), 3.6), squeeze=False)
    for ax, label in zip(axes[0], labels):
        s = d[d["label"] == label].set_index("run")
        (s[["compute_s", "comm_s"]] * 1e3).plot.barh(stacked=True, ax=ax, legend=False,
                                                     color=["#4c72b0", "#dd8452"])
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("time per GEMM (ms, median)")
        ax.set_ylabel("")
    fig.tight_layout()
    handles, _ = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, ["compute (local GEMMs)", "exposed communication"], loc="upper center",
               ncol=2, bbox_to_anchor=(0.5, 0.0), fontsize=8)
    return figs.figure(fig, f"Time breakdown at {size}: compute = time inside local GEMMs, "
                            "communication = total - compute (slowest rank, median).")


def _fmt_ms(df: pd.DataFrame) -> pd.Series:
    return ((df["time_s_median"] * 1e3).map("{:.3g}".format) + " (" +
            (df["time_s_min"] * 1e3).map("{:.3g}".format) + "-" +
            (df["time_s_max"] * 1e3).map("{:.3g}".format) + ")")


def render(files: list[Path], figs: Figures) -> str:
    single, multi = _collect(files, "single"), _collect(files, "multi")
    if single.empty and multi.empty:
        return "<p>No GEMM results.</p>"
    parts = []
    if not single.empty:
        single["size"] = _size(single)
        parts.append(_single_figure(single, figs))
        t = single[["host", "size", "dtype"]].assign(**{
            "time ms median (min-max)": _fmt_ms(single), "TFLOP/s": single["tflops_median"],
            "rel. error": single["rel_error"], "bound": single["bound"],
            "within bound": single["rel_error"] <= single["bound"]})
        parts.append(figs.table(t, "Single-device GEMM: time per call, median TFLOP/s and relative "
                                   "Frobenius error against float64."))
    if not multi.empty:
        multi["size"] = _size(multi)
        size = _largest(multi)
        parts.append(_multi_figure(multi, single.assign(size=_size(single)) if not single.empty
                                   else single, size, figs))
        parts.append(_breakdown_figure(multi, size, figs))
        t = multi[["host", "transport", "algorithm", "P", "grid", "size", "dtype"]].assign(**{
            "time ms median (min-max)": _fmt_ms(multi), "TFLOP/s": multi["tflops_median"],
            "compute ms": multi["compute_s"] * 1e3, "comm ms": multi["comm_s"] * 1e3,
            "rel. error": multi["rel_error"], "within bound": multi["rel_error"] <= multi["bound"]})
        parts.append(figs.table(t, "Multi-device GEMM runs (slowest rank per repetition; "
                                   "communication = total - compute)."))
    scal = _collect(files, "scaling")
    if not scal.empty:
        scal["size"] = _size(scal)
        s = scal[scal["size"] == _largest(scal)]
        cols = ["host", "transport", "algorithm", "dtype", "P", "tflops", "speedup", "efficiency",
                "efficiency_vs_p1"]
        parts.append(figs.table(s[cols], f"Strong scaling at {s['size'].iloc[0]}: speedup against "
                                         "the single-device baseline, efficiency = speedup / P; "
                                         "a P not measured (beyond the devices present) is in the "
                                         "result's not-applicable list, with its reason."))
    bars = _collect(files, "bars")
    if not bars.empty:
        parts.append(figs.table(bars[BAR_SHOWN],
                                "Bars: single-device TFLOP/s against the datasheet dense peak; "
                                "multi-device speed-up against the same GEMM on one device."))
    checks = _collect(files, "checks")
    # Matched by its prefix so the report does not import torch (gpulab.gemm.single.HARNESS_CHECK).
    harness = checks[checks["check"].str.startswith("harness overhead")] if not checks.empty \
        else checks
    if not harness.empty:
        parts.append(figs.table(harness[["host", "case", "value", "bound", "verdict", "note"]],
                                "Harness overhead check (not a performance result): gpulab's call "
                                "path vs the raw library call, same kernel; value = time ratio - 1."))
    na = _collect(files, "not_applicable")
    if not na.empty:
        parts.append(figs.table(na, "What was not measured here, and why."))
    parts.append(f"<p>{esc(_checks_sentence(files))}</p>")
    return "\n".join(parts)


def _checks_sentence(files: list[Path]) -> str:
    return "Verification: " + checks_summary(files, "GEMM checks verified")


# Headlines report one fixed, named configuration (issue 24), never the best of several: the
# precision the harness check uses, at the largest size measured; the multi-device bar's own
# fixed algorithm. A failed bar is named whatever it is.
HEADLINE_DTYPE = "bf16"


def _fixed_dtype(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of HEADLINE_DTYPE, else of the first precision in stored order."""
    names = list(dict.fromkeys(df["dtype"])) if "dtype" in df.columns else []
    if not names:
        return df
    return df[df["dtype"] == (HEADLINE_DTYPE if HEADLINE_DTYPE in names else names[0])]


def headlines(files: list[Path]) -> list[str]:
    out = []
    single = _collect(files, "single")
    if not single.empty:
        rows = _fixed_dtype(single)
        work = rows["M"].astype(float) * rows["N"] * rows["K"]
        r = rows.loc[work.idxmax()]
        out.append(f"Single-device GEMM {r['dtype']} {r['M']}x{r['N']}x{r['K']}: "
                   f"{r['tflops_median']:.3g} TFLOP/s on {r['host']}.")
    bars = _collect(files, "bars")
    if not bars.empty:
        failed = bars[bars["verdict"] == Verdict.FAIL]
        peak = bars[bars["unit"] == "TFLOP/s"]
        fixed = peak[peak["bar"].str.contains(f" {HEADLINE_DTYPE} ", regex=False)]
        b = (fixed if len(fixed) else peak).head(1)
        if len(b):
            b = b.iloc[0]
            what = (f"{b['measured']:.4g} of {b['reference']:.4g} TFLOP/s ({b['ratio']:.1%}; bar "
                    f"{b['threshold']:.0%}): {b['verdict']}" if b["verdict"] != Verdict.NOT_APPLICABLE
                    else f"not applicable ({b['note']})")
            out.append(f"{b['bar']}: {what}." + (
                f" Failed bars: {len(failed)} of {len(bars)}." if len(failed) else ""))
        multi = bars[bars["bar"].str.startswith("multi-device GEMM")
                     & (bars["verdict"] != Verdict.NOT_APPLICABLE)]
        if len(multi):
            m = multi.iloc[0]
            out.append(f"{m['bar']}: {m['measured']:.3g}x on {m['reference']:.0f} GPUs "
                       f"({m['ratio']:.0%} efficiency; bar {m['threshold']:.0%}): {m['verdict']}. "
                       f"{_checks_sentence(files)}")
    if len(out) < 3:
        out.append(_checks_sentence(files))
    return out[:3]


def references(files: list[Path]) -> pd.DataFrame:
    """The single-device bars that have a datasheet peak, as fractions of it."""
    bars = _collect(files, "bars")
    return bar_references(bars[bars["unit"] == "TFLOP/s"] if not bars.empty else bars)
