"""The report's chapters around the stage sections: abstract, methods, comparison with references.

Each function returns the inner HTML of one chapter; :mod:`gpulab.report` puts them in order.
"""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import pandas as pd  # noqa: E402

from gpulab import limits, outcomes, results, seedref  # noqa: E402
from gpulab.report import bars_figure  # noqa: E402
from gpulab.report import references as refs  # noqa: E402
from gpulab.report import verdicts  # noqa: E402
from gpulab.kit.html import Figures, esc, note  # noqa: E402
from gpulab.report.fragments import Fragment  # noqa: E402

GENERAL_METHODS = """
<p>Every number comes from an HDF5 result file written by one pipeline job; this report reads only
those files. <b>Timing</b>: each measurement is warmed up, then repeated (at least 5 times in the GPU
preset); we report the median with the minimum and maximum. On GPUs, time is taken with CUDA events
on the stream that does the work; on CPUs with a monotonic clock. Inputs are random data, never
zeros. <b>Bandwidth</b> is counted in bytes once per direction (1 GB/s = 10<sup>9</sup> B/s); a
same-device copy also reports read+write traffic, and a bidirectional figure is the sum of both
directions. <b>Collectives</b> report algorithm bandwidth (algbw = bytes / time) and bus bandwidth
(busbw, algbw scaled by the nccl-tests factor, e.g. 2(n-1)/n for all-reduce). <b>Verification</b>:
every benchmark checks its own output (sorted permutation, exact sums, relative error against a
float64 reference) and records the check beside the timing. Results measured on CPU "virtual
devices" (hosts without a GPU) run the same algorithms on CPU tensors and gloo processes; they are
labelled <i>cpu</i> and never mixed with GPU numbers silently.</p>
"""


def system_line(probe_files: list[Path]) -> str:
    """'host-a (1x NVIDIA H200, AMD EPYC 9654), host-b (no GPU, ...)' from the probe results."""
    out = []
    for f in probe_files:
        a = results.read_attrs(f)
        host = results.read_table(f, "host").set_index("key")["value"]
        cpu = host.get("cpu_model", "unknown CPU")
        if a.get("has_gpus"):
            names = results.read_table(f, "gpus")["name"].value_counts()
            gpus = ", ".join(f"{n}x {name}" for name, n in names.items())
        else:
            gpus = "no GPU: CPU virtual devices"
        out.append(f"{a.get('host')} ({gpus}; {cpu})")
    return "; ".join(out)


def abstract(frags: list[Fragment], probe_files: list[Path], all_files: list[Path]) -> str:
    hosts = sorted({str(results.read_attrs(f).get("host")) for f in all_files})
    system = system_line(probe_files) if probe_files else "an unprobed system"
    parts = [f"<p>We measure what {esc(system)} can really do: links and transfers, kernels, "
             f"collectives, sorting, GEMM and parallel training, each verified and timed with "
             f"repetitions. This report was generated from {len(all_files)} result file(s) "
             f"from {len(hosts)} host(s) ({esc(', '.join(hosts)) or 'none'}).</p>"]
    # One verdict line per result, before any headline: what was judged comes first.
    parts.append(verdicts.html([v for f in frags for v in f.verdict_lines()]))
    items = []
    for frag in frags:
        if frag.headlines:
            items.append(f"<li><b>{esc(frag.title)}</b> [{esc(frag.devices)}]: "
                         f"{esc(' '.join(s.strip() for s in frag.headlines))}</li>")
    if items:
        parts.append("<p>Key results:</p><ul>" + "".join(items) + "</ul>")
    else:
        parts.append(note("No stage has reported headline numbers yet."))
    if any(results.read_attrs(f).get("device_kind") == "cpu" for f in all_files):
        parts.append(note("Results marked [cpu ...] ran on CPU virtual devices (no GPU was visible): "
                          "they exercise the same algorithms on real data, but are CPU numbers."))
    return "\n".join(parts)


def methods(frags: list[Fragment], number: str) -> str:
    parts = [f"<h3>{number}.1 Common conventions</h3>{GENERAL_METHODS}"]
    for i, frag in enumerate(frags, start=2):
        text = frag.methods
        if not text or not text.strip():
            text = note(f"The section of stage '{frag.stage}' states no methodology (METHODS).")
        parts.append(f'<h3 id="methods-{esc(frag.stage)}">{number}.{i} {esc(frag.title)}</h3>{text}')
    return "\n".join(parts)


def _fraction_figure(bars: pd.DataFrame, references: pd.DataFrame, figs: Figures) -> str:
    rows, others = bars_figure.bar_rows(bars), bars_figure.other_rows(references, bars)
    fig = bars_figure.figure(rows, others)
    if fig is None:
        return ""
    top = (f"{'Top panel' if len(others) else 'Bars'}: every judged bar, one row each ({len(rows)}; "
           "failed first, coloured by verdict, the tick marks its threshold; not-applicable bars are "
           "in the table above). " if len(rows) else
           "No bar was judged here (every bar is not applicable: see the table above). ")
    rest = (f"{'Bottom panel' if len(rows) else 'Comparisons'}: comparisons that are not bars (other "
            "machines such as the seed's RTX A5000, references without a threshold): no verdict. "
            if len(others) else "")
    return figs.figure(fig, "Measured figures as a fraction of their reference. " + top + rest
                       + "Each stage's counting convention as in its methods section.")


def _a5000_figure(figs: Figures) -> str:
    mats = refs.a5000_p2p()
    show = [("uni_ce_p2p_disabled_GBps", "uni, P2P off (GB/s)"),
            ("uni_ce_p2p_enabled_GBps", "uni, P2P on (GB/s)"),
            ("bi_ce_p2p_disabled_GBps", "bi, P2P off (GB/s)"), ("bi_ce_p2p_enabled_GBps", "bi, P2P on (GB/s)"),
            ("latency_ce_p2p_disabled_gpu_us", "latency, P2P off (us)"),
            ("latency_ce_p2p_enabled_gpu_us", "latency, P2P on (us)")]
    fig, axes = plt.subplots(2, 3, figsize=(9, 5.2))
    for ax, (key, title) in zip(axes.flat, show):
        sns.heatmap(mats[key], annot=True, fmt=".3g", cbar=False, cmap="viridis", ax=ax)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("dst GPU")
        ax.set_ylabel("src GPU")
    fig.tight_layout()
    return figs.figure(fig, "Reference: CUDA samples' p2pBandwidthLatencyTest on 2x RTX A5000 "
                            f"with {seedref.LINK} (seed notes). Bandwidth in GB/s, one direction (uni) "
                            "or the sum of both (bi); latency in microseconds; rows: source GPU.")


def comparison(frags: list[Fragment], files: list[Path],
               gpu_names: list[str], figs: Figures, number: str) -> str:
    parts = []

    bars = results.collect(files, outcomes.BARS)
    parts.append(f"<h3>{number}.1 Performance bars</h3>")
    if not bars.empty:
        bars = bars.reindex(columns=list(dict.fromkeys(list(bars.columns) + outcomes.BAR_COLUMNS)))
        old = bars[bars["verdict"].isna()]
        if len(old):  # written before the one vocabulary: named, not mixed into the table
            parts.append(note("Bars without a verdict (not in the result vocabulary) left out: " + ", ".join(
                sorted({f"{r.stage} on {r.host}" for r in old.itertuples()}))))
            bars = bars.drop(old.index)
    if bars.empty:
        parts.append(note(f"No stage recorded a performance bar (table '{outcomes.BARS}')."))
    else:
        parts.append(figs.table(bars[["stage", "host", "device_kind"] + outcomes.BAR_COLUMNS],
                                "Performance bars: each measurement against a reference from "
                                "elsewhere (column source: a datasheet limit, an independent tool, "
                                "the same work on one device); ratio = measured / reference, verdict "
                                "pass when the ratio meets the threshold in the stated direction, "
                                "not_applicable with the reason where it cannot be judged here.",
                                max_rows=200))

    parts.append(f"<h3>{number}.2 Measured figures against references</h3>")
    frames, keyed = [], []
    for frag in frags:
        df = frag.references_frame()
        if df is not None and len(df):
            df.insert(0, "stage", frag.title)
            frames.append(df)
            keyed.append(df.assign(stage=frag.stage))  # the figure's labels: the short stage name
    if frames:
        table = pd.concat(frames, ignore_index=True)
        cols = ["stage"] + [c for c in table.columns if c != "stage"]
        parts.append(figs.table(table[cols], "Each stage's key figures against reference figures "
                                "(datasheet limits, the seed's RTX A5000 numbers, measured peaks); "
                                "fraction = measured / reference.", max_rows=200))
    else:
        parts.append(note("No stage compared its numbers with reference figures yet."))
    parts.append(_fraction_figure(bars, pd.concat(keyed, ignore_index=True) if keyed
                                  else pd.DataFrame(columns=outcomes.REFERENCE_COLUMNS + ["stage"]), figs))

    parts.append(f"<h3>{number}.3 Datasheet limits</h3>")
    ds = refs.datasheets()
    present = {(limits.model_of(n) or {}).get("model") for n in gpu_names} - {None}
    ds.insert(1, "measured here", ds["gpu"].map(lambda g: "yes" if g in present else "no"))
    parts.append(figs.table(ds, "Vendor datasheet limits (gpulab/limits.yaml; dense tensor-core "
                            "peaks; NVLink and PCIe per direction, after encoding). 'measured here': "
                            "a GPU of this model is among the systems under test.", max_rows=100))

    parts.append(f"<h3>{number}.4 The seed's RTX A5000 system</h3>")
    parts.append(_a5000_figure(figs))
    parts.append(figs.table(refs.a5000_p2p_summary(), "Key numbers of the RTX A5000 reference "
                            f"(mean over the matching cells of the matrices in Figure {figs.figure_no}).",
                            max_rows=50))
    return "\n".join(parts)
