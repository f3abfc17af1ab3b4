"""Data loading: CSV, JSON and HDF5 into torch tensors, per format, loader and dataset size."""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import pandas as pd  # noqa: E402

from gpulab import outcomes, results  # noqa: E402
from gpulab.kit.html import Figures  # noqa: E402

TITLE = "Data loading: CSV, JSON and HDF5"

METHODS = """
<p>Every dataset (scikit-learn's 1797 8x8 digits, scaled to [0, 1]; synthetic Gaussian tabular
data with labels from a fixed random linear teacher; synthetic 8-bit image-like data, all drawn
from a fixed seed) is written once per format: CSV and JSON (records, and JSON lines) with 9
significant digits per float, enough for every float32 to come back bit for bit, and chunked HDF5
(chunks of <i>batch_rows</i> samples) plain, gzip (with the shuffle filter) or LZF. Each loader turns
the file into validated torch tensors (x float32, y int64): pandas' C parser (whole file, and
<i>batch_rows</i> rows at a time), Python's <code>csv</code> module, Python's <code>json</code>
(records; JSON lines one line at a time) and h5py (one read per dataset, or one read per chunk).
Validation (expected columns, numbers, no missing values, whole non-negative labels) is part of
every load. Each loader runs warm-up loads, then timed loads (median, min, max); <b>file MB/s</b>
= file size on disk (MB = 10<sup>6</sup> B) / median load time and <b>rows/s</b> = samples / median
load time. <b>Time to first batch</b> is the time until the first <i>batch_rows</i> samples are
tensors; a whole-file loader delivers nothing before the whole file is parsed, so its first batch
is its full load. <b>Peak memory</b> is the rise of the process's resident high-water mark during
one load (reset through <code>/proc/self/clear_refs</code>), which includes the parsers' own
buffers. Every load is checked against what was written, exactly. Files are read right after they
are written, so the page cache is warm: these are parse and decode costs, not disk speed. The
stage runs on the host CPU only (one core per loader).</p>
"""

LOAD_COLS = {"format": "format", "method": "loader", "file_MB": "file (MB)",
             "load_ms": "load median (ms)", "load_min_ms": "min (ms)", "load_max_ms": "max (ms)",
             "file_MBps": "file MB/s", "Mrows_per_s": "M rows/s", "ttfb_ms": "first batch (ms)",
             "peak_mem_MB": "peak mem (MB)", "round_trip": "round trip"}


def _loads(files: list[Path]) -> pd.DataFrame:
    df = results.collect(files, "loads")
    if df.empty:
        return df
    df["loader"] = df["format"] + " / " + df["method"]
    df["file_MB"] = df["file_bytes"] / 1e6
    df["load_ms"] = df["load_s_median"] * 1e3
    df["load_min_ms"] = df["load_s_min"] * 1e3
    df["load_max_ms"] = df["load_s_max"] * 1e3
    df["Mrows_per_s"] = df["rows_per_s"] / 1e6
    df["ttfb_ms"] = df["ttfb_s_median"] * 1e3
    df["peak_mem_MB"] = df["peak_mem_bytes"] / 1e6
    return df


def _largest(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    sub = df[df["kind"] == kind]
    return sub[sub["rows"] == sub["rows"].max()] if not sub.empty else sub


def _throughput_figure(df: pd.DataFrame, figs: Figures) -> str:
    hosts = sorted(df["host"].unique())
    g = sns.catplot(data=df, kind="bar", y="loader", x="rows_per_s", hue="dataset", col="host",
                    col_order=hosts, height=max(3.5, 0.35 * df["loader"].nunique()), aspect=1.6,
                    orient="h", sharex=True)
    g.set(xscale="log")
    g.set_axis_labels("samples loaded per second (log scale)", "format / loader")
    g.set_titles("{col_name}")
    return figs.figure(g.figure, "Load throughput: samples per second (median of the timed loads, "
                                 "file to validated torch tensors, warm page cache), by format and "
                                 "loader, for each dataset; one panel per host.")


def _size_figure(files: list[Path], figs: Figures) -> str:
    w = results.collect(files, "writes")
    if w.empty:
        return ""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.barplot(data=w, x="format", y="bytes_per_value", hue="dataset", seed=0, ax=ax)
    ax.set_ylabel("bytes on disk per stored value")
    ax.set_xlabel("format")
    ax.legend(fontsize=7, title=None)
    return figs.figure(fig, "File size on disk per stored value (features and labels), by format "
                            "and dataset (float32 in memory is 4 B per value). Text formats store 9 "
                            "significant digits; the digits data (multiples of 1/16) is shorter.")


def _table(df: pd.DataFrame, host: str, figs: Figures) -> str:
    out = []
    for kind in ("tabular", "images", "real", "external"):
        sub = _largest(df[df["host"] == host], kind)
        if sub.empty:
            continue
        name = sub["dataset"].iloc[0]
        t = sub[list(LOAD_COLS)].rename(columns=LOAD_COLS)
        out.append(figs.table(t, f"{host}: loading {name} ({int(sub['rows'].iloc[0])} samples of "
                                 f"{int(sub['values_per_row'].iloc[0])} values): median load time with "
                                 "min/max over the timed loads, throughput, time to the first batch, "
                                 "peak memory, exact round trip."))
    return "\n".join(out)


def render(files: list[Path], figs: Figures) -> str:
    df = _loads(files)
    if df.empty:
        return "<p>No data-loading results.</p>"
    parts = [_throughput_figure(df, figs), _size_figure(files, figs)]
    for host in sorted(df["host"].unique()):
        parts.append(_table(df, host, figs))
    checks = results.collect(files, outcomes.CHECKS)
    if not checks.empty:
        judged = checks[checks.verdict != outcomes.Verdict.NOT_APPLICABLE.value]
        n_ok = int((judged.verdict == outcomes.Verdict.PASS.value).sum())
        parts.append(f"<p>Round-trip checks: {n_ok} of {len(judged)} loads returned exactly the "
                     f"data written.</p>")
    na = results.collect(files, outcomes.NOT_APPLICABLE)
    if not na.empty:
        parts.append(figs.table(na[["host", "what", "reason"]], "Not checked, and why."))
    return "\n".join(p for p in parts if p)


def headlines(files: list[Path]) -> list[str]:
    df = _loads(files)
    if df.empty:
        return []
    lines = []
    for host in sorted(df["host"].unique())[:2]:
        sub = _largest(df[df["host"] == host], "tabular")
        if sub.empty:
            continue
        best = sub.loc[sub.groupby("format")["rows_per_s"].idxmax()].set_index("format")
        rate = ", ".join(f"{fmt} {best.loc[fmt, 'rows_per_s'] / 1e6:.2g} M"
                         for fmt in ("h5", "csv", "json", "jsonl") if fmt in best.index)
        lines.append(f"Loading {int(sub['rows'].iloc[0]):,} tabular rows of "
                     f"{int(sub['values_per_row'].iloc[0])} floats into tensors on {host}, best "
                     f"rows/s per format: {rate}.")
    return lines

