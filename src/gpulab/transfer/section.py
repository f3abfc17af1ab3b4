"""Transfers: the p2pBandwidthLatencyTest matrices, host <-> device, hybrid split, cudaMalloc cost."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

from gpulab.kit.plotting import plt, sns
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from gpulab import outcomes, results  # noqa: E402
from gpulab.kit.frames import failed_suffix, host_kind, host_kind_column  # noqa: E402
from gpulab.kit.html import Figures, esc  # noqa: E402

TITLE = "Transfers: peer-to-peer, host <-> device, hybrid split, allocation cost"

METHODS = """
<p>The P2P matrices reproduce NVIDIA's <code>p2pBandwidthLatencyTest</code> in Python with CuPy's raw
runtime API on raw <code>cudaMalloc</code> pointers. A sample: a spin kernel holds the issuing stream on
a flag in mapped host memory, a start event is recorded, <i>copies</i> back-to-back copies are queued
(<code>cudaMemcpyPeerAsync</code> for the copy engine, a 16-byte grid-stride copy kernel for SM copies),
a stop event is recorded and the host releases the flag. Copies are P2P writes: row = source device,
which issues the copy; column = destination. Bidirectional: the destination's second stream waits on
the start event and copies back at the same time. Latency: 16-byte copies; GPU latency from the
events, CPU latency = host time spent queueing each call (includes Python's call overhead). Added to
the sample: warm-up samples, several samples with median and min/max spread, a size sweep, and every
destination read back and compared byte for byte with the random source.</p>
<p>Peer access is toggled only with <code>cudaDeviceEnablePeerAccess</code>/<code>DisablePeerAccess</code>.
CuPy enables peer access on its own when one of its kernels touches another GPU's array, and torch
does on cross-device copies, so the P2P=Disabled matrices are measured in a separate process that
never enables it, never imports torch and never creates a CuPy array; at its end
<code>cudaDeviceDisablePeerAccess</code> must answer <i>not enabled</i> for every pair (recorded as the
isolation check). Host &lt;-&gt; device: pinned (<code>cudaHostAlloc</code>) vs pageable (numpy) memory,
<code>cudaMemcpyAsync</code> timed with events vs blocking <code>cudaMemcpy</code> timed with the host clock,
and pinned H2D to every GPU issued from one host thread vs one thread per GPU. The hybrid transfer
splits GPU0&rarr;GPU1 bytes between the P2P path and a chunked, pipelined path through pinned host memory in
the ratio R = BW<sub>p2p</sub>/BW<sub>host</sub> of the measured bandwidths. cudaMalloc cost: one raw
call timed per allocation, grouped by the number of prior live allocations (power-of-two bins),
without and with every peer mapping enabled. On CPU hosts the matrices are measured between CPU
virtual devices (numpy <code>copyto</code>, a memcpy that releases the GIL, one worker thread per
direction); host memcpy is measured everywhere.</p>
<p>Conventions: bytes are counted once per direction, GB/s = 10<sup>9</sup> B/s; a same-device copy
counts read + write (2&times; the bytes), as the sample does and as the datasheet's memory bandwidth
counts traffic; bidirectional bandwidth is the sum of both directions; latency = sample time /
copies. At most 256 operations are queued per stream per sample (a stream holds only so many; past
that the spin kernel times out and small sizes read about 2&times; too slow); the spin kernel records
a timeout, such a sample is taken again twice and then dropped, and a failed check counts it. Sizes
whose working set fits in the GPU's L2 cache are marked <i>cache-resident</i>: they measure the
cache, not memory.</p>
<p>Bars compare with physical limits from <code>gpulab/limits.yaml</code> (vendor datasheets) and the
PCIe specification: the same-device copy (read+write) against the datasheet memory bandwidth
(&ge; 0.75); pinned H2D and D2H (cudaMemcpyAsync, largest size, bytes once) against the PCIe limit of
the generation and width the link can train to in its slot, per direction after encoding (&ge; 0.75;
the generation and width it ran at right after the copies are noted); P2P=Enabled copy-engine
bandwidth per GPU pair against the pair's NVLink limit (datasheet per-GPU NVLink bandwidth &times;
the share of the GPU's links that reach the peer, directly or through NVSwitch) or, without NVLink,
the slower GPU's PCIe limit (&ge; 0.70). A GPU model missing from the table gives
<i>not_applicable</i> with the reason, never a guessed limit. <b>Harness overhead</b> checks compare
gpulab's raw runtime calls with torch issuing the same copies on the same engine (&ge; 0.95): they
measure the framework, not the hardware, and are not performance results. Also checked: every copy
read back byte for byte, the spin kernel never timed out, P2P=Disabled stayed isolated, run-to-run
spread (max&minus;min)/median &le; 5%.</p>
"""

BW_ORDER = ["uni_ce_p2p_disabled_GBps", "uni_ce_p2p_enabled_GBps", "bi_ce_p2p_disabled_GBps",
            "bi_ce_p2p_enabled_GBps", "uni_sm_p2p_disabled_GBps", "uni_sm_p2p_enabled_GBps",
            "bi_sm_p2p_disabled_GBps", "bi_sm_p2p_enabled_GBps", "uni_memcpy_GBps", "bi_memcpy_GBps"]

# The seed's table order: bandwidth disabled/enabled, uni then bi; latency disabled/enabled, GPU then CPU.
SEED_ORDER = ["uni_ce_p2p_disabled_GBps", "uni_ce_p2p_enabled_GBps", "bi_ce_p2p_disabled_GBps",
              "bi_ce_p2p_enabled_GBps", "latency_ce_p2p_disabled_gpu_us", "latency_ce_p2p_disabled_cpu_us",
              "latency_ce_p2p_enabled_gpu_us", "latency_ce_p2p_enabled_cpu_us"]


def _tables(f: Path) -> list[str]:
    return results.list_contents(f)["tables"]


def _host(f: Path) -> str:
    return host_kind(results.read_attrs(f))


def _heatmaps(f: Path, names: list[str], figs: Figures, what: str, fmt: str) -> str:
    present = [n for n in names if n in results.list_contents(f)["matrices"]]
    if not present:
        return ""
    mats = [results.read_matrix(f, n) for n in present]
    size = len(mats[0][0])
    cols = min(4 if size <= 4 else 2, len(present))
    rws = math.ceil(len(present) / cols)
    cell = min(0.9, 5.0 / size)  # inches per matrix cell: 8 GPUs still fit the page
    width = 1.6 + cell * size
    # Titles wrap to their panel (about 16 characters per inch at 7 pt): one-GPU panels are narrow.
    titles = [textwrap.fill(meta.get("title", ""), max(12, int(width * 16))) for _, meta in mats]
    lines = max(t.count("\n") + 1 for t in titles)
    fig, axes = plt.subplots(rws, cols, figsize=(cols * width, rws * (1.2 + 0.15 * lines + cell * size)),
                             squeeze=False)
    for ax, (m, meta), title in zip(axes.flat, mats, titles):
        sns.heatmap(pd.DataFrame(m, index=meta["rows"], columns=meta["cols"]), annot=True, fmt=fmt,
                    cbar=False, cmap="viridis", ax=ax, annot_kws={"size": 8})
        ax.set_title(title, fontsize=7)
        ax.set_xlabel("destination")
        ax.set_ylabel("source")
    for ax in list(axes.flat)[len(mats):]:
        ax.axis("off")
    fig.tight_layout()
    return figs.figure(fig, f"{what} on {_host(f)}, laid out like p2pBandwidthLatencyTest's tables "
                            "(row = source, column = destination; median of the samples). Same-device "
                            "cells count read+write; bidirectional = sum of both directions; empty = "
                            "not measurable (SM copy across devices needs peer access).")


def _reference_heatmaps(f: Path, figs: Figures) -> str:
    have = results.list_contents(f)["matrices"]
    names = [f"ref_a5000_{n}" for n in SEED_ORDER if f"ref_a5000_{n}" in have]
    if not names:
        return ""
    fig, axes = plt.subplots(2, 4, figsize=(13, 5.2))
    for ax, n in zip(axes.flat, names):
        m, meta = results.read_matrix(f, n)
        sns.heatmap(pd.DataFrame(m, index=meta["rows"], columns=meta["cols"]), annot=True, fmt=".3g",
                    cbar=False, cmap="viridis", ax=ax, annot_kws={"size": 8})
        ax.set_title(n.replace("ref_a5000_", "") + f" ({meta['unit']})", fontsize=8)
    fig.tight_layout()
    return figs.figure(fig, "Reference: the seed's p2pBandwidthLatencyTest on 2x RTX A5000 with NVLink "
                            "(parsed from its output; its same-device cells count read+write too).")


def _sweep_figure(df: pd.DataFrame, figs: Figures, x: str, hue: str, style: str | None, title: str,
                  ylabel: str) -> str:
    d = df.copy()
    d["KiB"] = d[x] / 1024
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    # seed=0 here and in every section: seaborn bootstraps its error band at random, and two builds
    # of one report from the same results must draw the same figures.
    sns.lineplot(data=d, x="KiB", y="value_median", hue=hue, style=style, marker="o", seed=0, ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per copy (KiB)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return figs.figure(fig, title)


def _with_host(files: list[Path], table: str) -> pd.DataFrame:
    df = results.collect(files, table)
    if len(df):
        df["who"] = host_kind_column(df)
    return df


def _sweeps(files: list[Path], figs: Figures) -> list[str]:
    parts = []
    sw = _with_host(files, "p2p_sweep")
    if len(sw):
        sw["path"] = (sw["mechanism"] + ", P2P " + sw["p2p"] + ", GPU" + sw["src"].astype(str) + "->GPU"
                      + sw["dst"].astype(str))
        resident = sw["cache_resident"].astype(bool) if "cache_resident" in sw else pd.Series(False, sw.index)
        sw["working set"] = resident.map({True: "fits in L2 (cache)", False: "memory"})
        style = "working set" if resident.any() else ("who" if sw["who"].nunique() > 1 else None)
        parts.append(_sweep_figure(sw, figs, "bytes", "path", style,
                                   "P2P bandwidth vs copy size (copy engine and SM copy; same-device "
                                   "paths count read+write; median of the samples; at most 256 copies "
                                   "queued per sample). Sizes whose working set fits in the L2 cache "
                                   "are marked: they measure the cache, not memory bandwidth.", "GB/s"))
    hd = _with_host(files, "host_device")
    if len(hd):
        hd["mode"] = hd["direction"] + " " + hd["memory"]
        parts.append(_sweep_figure(hd, figs, "bytes", "mode", "call",
                                   "Host <-> device bandwidth vs size on GPU0: pinned vs pageable host "
                                   "memory, cudaMemcpyAsync (CUDA events) vs blocking cudaMemcpy (host "
                                   "clock); bytes counted once; " + ", ".join(sorted(hd["who"].unique())) + ".",
                                   "GB/s (one direction)"))
    hm = _with_host(files, "host_memcpy")
    if len(hm):
        parts.append(_sweep_figure(hm, figs, "bytes", "who", None,
                                   "Host memcpy bandwidth vs size (one thread, numpy copyto, buffer to "
                                   "buffer; bytes counted once: x2 for read+write). Small sizes sit in "
                                   "CPU caches.", "GB/s (bytes once)"))
    return parts


def _malloc_figure(files: list[Path], figs: Figures) -> str:
    m = _with_host(files, "malloc")
    if not len(m):
        return ""
    m["prior allocations"] = (m["prior_from"] + m["prior_to"]) / 2 + 1
    m["peer access"] = m["peer_access"] + " (" + m["peers"].astype(str) + " peers)"
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=m, x="prior allocations", y="time_us_median", hue="peer access",
                 style="who" if m["who"].nunique() > 1 else None, marker="o", seed=0,
                 ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_ylabel("cudaMalloc time (us, median in bin)")
    return figs.figure(fig, "cudaMalloc cost vs number of prior live allocations (power-of-two bins, "
                            f"{int(m['alloc_bytes'].iloc[0])} B each), without and with peer access "
                            "enabled: the seed's O(lg N) vs O(D lg N) claim.")


def _cols(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df[[c for c in cols if c in df.columns]]


def render(files: list[Path], figs: Figures) -> str:
    parts = []
    for f in files:
        a = results.read_attrs(f)
        kind = a.get("device_kind")
        parts.append(f"<h3>{esc(_host(f))}</h3>")
        names = ", ".join(a.get("gpu_names") or a.get("device_names") or [])
        parts.append(f"<p>{a.get('device_count')} device(s): {esc(names)}. P2P=Disabled isolation: "
                     f"{esc(a.get('isolation_check', '?'))}. Verdict: <b>{esc(a.get('verdict', '?'))}</b> "
                     f"({esc(a.get('verdict_summary', ''))}).</p>")
        if kind != "cuda":
            parts.append('<p class="note">No GPU: the matrices below are host memcpy between CPU virtual '
                         "devices (threads' buffers); the GPU measurements are listed as not "
                         "applicable.</p>")
        parts.append(_heatmaps(f, BW_ORDER, figs, "Bandwidth matrices (GB/s)", ".4g"))
        lat = sorted((n for n in results.list_contents(f)["matrices"] if n.startswith("latency_")),
                     key=lambda n: (n.split("_")[1] != "ce", "enabled" in n, n.endswith("cpu_us")))
        parts.append(_heatmaps(f, lat, figs, "Latency matrices (us)", ".3g"))
        tabs = _tables(f)
        if outcomes.BARS in tabs:
            parts.append(figs.table(results.read_table(f, outcomes.BARS)[outcomes.BAR_COLUMNS],
                                    f"Bars on {_host(f)}: measured against a physical limit (source "
                                    "column); ratio = measured / reference, pass when it meets the "
                                    "threshold; not_applicable with the reason."))
        if outcomes.CHECKS in tabs:
            ch = results.read_table(f, outcomes.CHECKS)
            shown = ch[(ch.check != "copy verified") | (ch.verdict != outcomes.Verdict.PASS)]
            shown = shown[(shown.check != "spin kernel held the stream") | (shown.verdict != outcomes.Verdict.PASS)]
            if len(shown):
                parts.append(figs.table(shown, f"Checks on {_host(f)} (harness overhead = gpulab's call "
                                               "path vs torch on the same copy: framework overhead, not a "
                                               "performance result; passing copy and spin-kernel checks "
                                               f"omitted: {len(ch) - len(shown)} more, all pass)."))
        if "hybrid" in tabs:
            h = _cols(results.read_table(f, "hybrid"), ["path", "bytes", "p2p_bytes", "host_bytes",
                                                        "ratio_R", "value_median", "value_min", "value_max",
                                                        "speedup_vs_best_single", "verified"])
            parts.append(figs.table(h, f"Hybrid split GPU0->GPU1 on {_host(f)} (GB/s, bytes once, host "
                                       "clock): each path alone and split R/(1+R) : 1/(1+R)."))
        if "host_device_threads" in tabs:
            t = _cols(results.read_table(f, "host_device_threads"),
                      ["threading", "call", "gpus", "bytes", "copies", "value_median", "value_min",
                       "value_max", "verified"])
            parts.append(figs.table(t, f"Pinned H2D to all GPUs at once on {_host(f)}: aggregate GB/s, "
                                       "one host thread for all GPUs vs one thread per GPU."))
        if "host_threads" in tabs:
            t = _cols(results.read_table(f, "host_threads"),
                      ["threads", "bytes", "copies", "value_median", "value_min", "value_max", "verified"])
            parts.append(figs.table(t, f"Host memcpy with T threads at once on {_host(f)} (aggregate "
                                       "GB/s, bytes counted once)."))
        if outcomes.NOT_APPLICABLE in tabs:
            na = results.read_table(f, outcomes.NOT_APPLICABLE)
            if len(na):
                parts.append(figs.table(na, f"Not applicable on {_host(f)}, and why."))
    parts += _sweeps(files, figs)
    parts.append(_malloc_figure(files, figs))
    if files:
        parts.append(_reference_heatmaps(files[0], figs))
    return "\n".join(p for p in parts if p)


def _diag(f: Path, name: str) -> float:
    if name not in results.list_contents(f)["matrices"]:
        return float("nan")
    m, _ = results.read_matrix(f, name)
    return float(np.nanmean(np.diag(m)))


def _offdiag(f: Path, name: str) -> float:
    if name not in results.list_contents(f)["matrices"]:
        return float("nan")
    m, _ = results.read_matrix(f, name)
    if len(m) < 2:
        return float("nan")
    return float(np.nanmean(m[~np.eye(len(m), dtype=bool)]))


def _h2d(f: Path) -> float:
    if "host_device" not in _tables(f):
        return float("nan")
    hd = results.read_table(f, "host_device")
    hd = hd[(hd.direction == "H2D") & (hd.memory == "pinned") & (hd.call == "async")]
    return float(hd.sort_values("bytes")["value_median"].iloc[-1]) if len(hd) else float("nan")


def _bar_fraction(f: Path, prefix: str) -> str:
    """' (0.83 of the datasheet limit)' for the first judged bar named ``prefix``, else ''."""
    if outcomes.BARS not in _tables(f):
        return ""
    b = results.read_table(f, outcomes.BARS)
    b = b[b.bar.str.startswith(prefix) & (b.verdict != outcomes.Verdict.NOT_APPLICABLE.value)]
    return f" ({b['ratio'].iloc[0]:.2f} of its limit, {b['verdict'].iloc[0]})" if len(b) else ""


def headlines(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        a = results.read_attrs(f)
        failed = failed_suffix(a)
        if a.get("device_kind") == "cuda":
            gpu = (a.get("gpu_names") or ["GPU"])[0]
            s = (f"Same-device copy: {_diag(f, 'uni_ce_p2p_enabled_GBps'):.0f} GB/s (read+write) on {gpu}"
                 f"{_bar_fraction(f, 'same-device copy')}; pinned H2D {_h2d(f):.1f} GB/s"
                 f"{_bar_fraction(f, 'pinned H2D')}")
            x = _offdiag(f, "uni_ce_p2p_enabled_GBps")
            out.append(s + (f"; GPU-GPU P2P {x:.0f} GB/s one way{_bar_fraction(f, 'P2P')}."
                            if not math.isnan(x) else ".") + failed)
        elif "host_memcpy" in _tables(f):
            hm = results.read_table(f, "host_memcpy")
            out.append(f"Host memcpy on {a.get('host')}: up to {hm['value_median'].max():.1f} GB/s "
                       "(one thread, bytes counted once); GPU transfer tests not applicable (no GPU)."
                       + failed)
    return out[:3]


def references(files: list[Path]) -> pd.DataFrame:
    """Measured figures against the seed's RTX A5000 run and against this stage's physical-limit bars."""
    rows = []
    for f in files:
        a = results.read_attrs(f)
        if a.get("device_kind") != "cuda":
            continue
        host = a.get("host")

        def ref(metric, measured, reference, source):
            if not (math.isnan(measured) or math.isnan(reference)):
                rows.append(outcomes.Reference.of(f"{metric} [{host}]", measured, reference, source))

        same = _diag(f, "uni_ce_p2p_enabled_GBps")
        seed = "seed p2pBandwidthLatencyTest, RTX A5000"
        ref("same-device copy GB/s (read+write)", same, _diag(f, "ref_a5000_uni_ce_p2p_enabled_GBps"), seed)
        if outcomes.BARS in _tables(f):
            for b in results.read_table(f, outcomes.BARS).itertuples():
                if b.verdict != outcomes.Verdict.NOT_APPLICABLE:
                    ref(b.bar + f" ({b.unit})", b.measured, b.reference, b.source)
        ref("GPU-GPU P2P uni GB/s", _offdiag(f, "uni_ce_p2p_enabled_GBps"),
            _offdiag(f, "ref_a5000_uni_ce_p2p_enabled_GBps"), seed)
        ref("GPU-GPU P2P bi GB/s", _offdiag(f, "bi_ce_p2p_enabled_GBps"),
            _offdiag(f, "ref_a5000_bi_ce_p2p_enabled_GBps"), seed)
        ref("GPU-GPU latency us (P2P on)", _offdiag(f, "latency_ce_p2p_enabled_gpu_us"),
            _offdiag(f, "ref_a5000_latency_ce_p2p_enabled_gpu_us"), seed)
        ref("same-device latency us (GPU)", _diag(f, "latency_ce_p2p_enabled_gpu_us"),
            _diag(f, "ref_a5000_latency_ce_p2p_enabled_gpu_us"), seed)
    return outcomes.references_frame(rows)
