"""The divide kernel against the copy roofline, its split over devices, and independent jobs."""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import pandas as pd  # noqa: E402

from gpulab import outcomes, results  # noqa: E402
from gpulab.kit.frames import failed_suffix, host_kind_column  # noqa: E402
from gpulab.kit.html import Figures, esc, note  # noqa: E402

TITLE = "Kernels: the divide kernel, splitting an image over devices, independent jobs"

# seed: p2pBandwidthLatencyTest diagonal on an RTX A5000. That test counts a same-device copy's
# read and write (it doubles the bytes on the diagonal), as the copy's gbps here does, so the two
# compare as they stand (issue 24: halving ours made the fraction half what it is).
A5000_D2D_GBPS = 675.82

METHODS = """
<p>The kernel is the seed's: every pixel of a random 8-bit image is divided by an integer
(C's <code>unsigned char / int</code>). On GPUs it runs as CuPy RawKernels: <i>naive</i> (one byte per
thread), <i>vec8</i> (the seed's <code>char_vec</code>: one 8-byte <code>int2</code> load and store per
thread) and <i>vec16</i> (one 16-byte <code>int4</code> load/store); sizes that are not a multiple of the
vector width are finished by a tail (the first <i>n</i> mod width threads divide one trailing byte
each). <i>torch</i> (<code>torch.floor_divide</code>, both device kinds) and <i>numpy</i> (CPU) are library
references. Every output is compared byte for byte with numpy's result; outputs start as
255&minus;answer, so a byte that is not written fails the check. Bandwidth counts bytes read plus
bytes written (2&times; the image) for the kernels and for the roofline alike: a torch copy of the
same size on the same device (D2D on a GPU), timed in the same run. Times are medians of
&ge;5 samples after warm-up (CUDA events on GPUs); a sample repeats the call until
<code>batch_bytes</code> went through (at least 32 calls on a GPU, so the event pair does not time one
launch latency) and reports the time per call. Sizes whose input and output together fit in the
GPU's L2 cache are marked <i>cache-resident</i>: they measure the cache, not memory, and no
datasheet bar uses them. Rows where the host needs at least 0.7&times; a call's GPU time to issue
it are marked <i>launch-bound</i>: the GPU waited on the host, so the figure is the host's launch
rate, and no bar uses them.</p>
<p>Bars: vec16 against the same-size copy (&ge; 0.8), vec8 against naive and vec16 against
<code>torch.floor_divide</code> (&ge; 1: different kernels on the same data, same run); the copy and the
best hand-written kernel against the datasheet memory bandwidth of the GPU model
(<code>gpulab/limits.yaml</code>; read+write counted on both sides; &ge; 0.75; an unknown model is
<i>not_applicable</i> with the reason); the split's pipelined vs serial (&ge; 1), speed-up over one
device / N (&ge; 0.8) and one host thread per device vs one for all (&ge; 0.95). On CPU virtual
devices the split figures are recorded with the bars <i>not_applicable</i> (the bars are for GPUs).
Checks: every output exact; the independent jobs spread over min(jobs, GPUs) ids and ran that many
at once.</p>
<p>The split cuts the image into equal chunks (16-byte aligned), one per device; each device has its
own stream(s) and device buffers, the host buffers are pinned (or pageable, for comparison) and the
copies are asynchronous. Events between the phases give per device: <i>copy to</i>, <i>kernel</i>,
<i>copy back</i>, their sum (component time) and first-to-last event (execution time), as in the
seed's "Create Stream for Each GPU" output. Modes: one host thread enqueueing for every device vs one
thread per device; serial (one chunk) vs pipelined (K sub-chunks over 2+ streams, so copies overlap
kernels: component/execution &gt; 1; below 1 the streams waited, on CPU for a free core). Split
throughput is image bytes / wall time. On CPU virtual
devices a stream is a worker thread, device buffers are separate host allocations and every device
uses one thread (numpy's division, single-threaded torch copies). The independent jobs are K
Snakemake jobs with <code>resources: gpu=1</code>, run through <code>gpulab-slot</code>, each recording
the GPU ids it held, its process launch (the slot holds the id from just before it) and its kernel
work's wall-clock start and end; concurrency is the largest number of job intervals open at once,
counted for the processes (launch to end) and for the kernel work alone (start to end).</p>
"""


def _split(files: list[Path]) -> tuple[list[Path], list[Path]]:
    mains, aggs = [], []
    for f in files:
        v = results.read_attrs(f).get("variant")
        (mains if v == "main" else aggs if v == "jobs" else []).append(f)
    return mains, aggs


def _divide_figure(df: pd.DataFrame, figs: Figures) -> str:
    d = df.copy()
    d["MiB"] = d["size_bytes"] / 2**20
    d["who"] = host_kind_column(d)
    multi = d["who"].nunique() > 1
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=d[d.variant != "copy"], x="MiB", y="gbps", hue="variant",
                 style="who" if multi else None, marker="o", seed=0, ax=ax)
    if "cache_resident" in d and d["cache_resident"].astype(bool).any():
        top = d[d["cache_resident"].astype(bool)]["MiB"].max()
        ax.axvspan(d["MiB"].min(), top, color="0.85", zorder=0, label="fits in L2 (cache, not memory)")
    cp = d[d.variant == "copy"]
    for who, g in cp.groupby("who"):
        ax.plot(g["MiB"], g["gbps"], "k--", lw=1.2, label=f"copy (roofline){' ' + who if multi else ''}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("image size (MiB)")
    ax.set_ylabel("GB/s (read + write)")
    ax.legend(fontsize=8)
    hosts = ", ".join(sorted(d["who"].unique()))
    return figs.figure(fig, f"Divide kernel bandwidth vs image size on {hosts}: GB/s counting bytes "
                            "read + written (2 x image), median of the samples; the dashed line is a "
                            "same-size copy on the same device (the roofline).")


def _divide_table(df: pd.DataFrame, figs: Figures) -> str:
    big = df[df["size_bytes"] == df.groupby("host")["size_bytes"].transform("max")]
    t = big[[c for c in ("host", "device_kind", "variant", "size_bytes", "gbps", "gbps_min", "gbps_max",
                         "fraction_of_copy", "cache_resident", "launch_bound", "verified")
                         if c in big.columns]].rename(columns={
                 "size_bytes": "size (B)", "gbps": "GB/s (r+w)", "gbps_min": "min",
                 "gbps_max": "max", "fraction_of_copy": "of copy"})
    return figs.table(t, "Divide kernel at the largest size: median GB/s (read + write) with the "
                         "min-max over samples, the fraction of the same-size copy, and the exact "
                         "check against numpy.")


def _phase_figure(ph: pd.DataFrame, host: str, figs: Figures) -> str:
    n = ph["devices"].max()
    d = ph[ph["devices"] == n].copy()
    d["row"] = d["mode"].str.replace(f"{n} dev, ", "", regex=False) + " | " + d["device"]
    wide = d.pivot_table(index="row", columns="phase", values="time_s_median", sort=False) * 1e3
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(wide) + 1.2))
    left = pd.Series(0.0, index=wide.index)
    colors = sns.color_palette("deep", 3)
    for phase, c in zip(("copy_to", "kernel", "copy_back"), colors):
        ax.barh(wide.index, wide[phase], left=left, color=c, label=phase.replace("_", " "))
        left += wide[phase]
    ax.scatter(wide["total"], wide.index, marker="|", s=200, color="k", label="execution time")
    ax.invert_yaxis()
    ax.set_xlabel("ms (median)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return figs.figure(fig, f"Split over {n} device(s) on {host}: per device, the phases summed over "
                            "sub-chunks (copy to, kernel, copy back; bars) and the execution time "
                            "(first to last event; tick). A tick left of the bar's end means phases "
                            "overlapped.")


def _gantt(jobs: pd.DataFrame, host: str, figs: Figures) -> str:
    from matplotlib.patches import Patch

    d = jobs.copy()
    d["ids"] = d["device_ids"].replace("", "none (CPU host)")
    ids = sorted(d["ids"].unique())
    pal = dict(zip(ids, sns.color_palette("tab10", len(ids))))
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(d) + 1.2))
    for _, r in d.iterrows():
        y = f"job {r['job']}"
        if "launch_s" in d.columns:  # process start to kernel start: interpreter and imports
            ax.barh(y, r["start_s"] - r["launch_s"], left=r["launch_s"], color=pal[r["ids"]],
                    alpha=0.3)
        ax.barh(y, r["end_s"] - r["start_s"], left=r["start_s"], color=pal[r["ids"]])
    handles = [Patch(color=pal[i], label=f"GPU {i}" if i[0].isdigit() else i) for i in ids]
    if "launch_s" in d.columns:
        handles.append(Patch(color="grey", alpha=0.3, label="process start-up"))
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first job's process started")
    ax.legend(handles=handles, fontsize=8, title="device ids held", loc="upper left",
              bbox_to_anchor=(1.01, 1))
    return figs.figure(fig, f"Independent kernel jobs on {host} (Gantt): each bar is one Snakemake "
                            "job (resources gpu=1, through gpulab-slot) from its kernel's start to "
                            "its end (pale: the process starting up), coloured by the GPU id it "
                            "held; overlapping bars ran concurrently.")


def render(files: list[Path], figs: Figures) -> str:
    mains, aggs = _split(files)
    parts = []
    if mains:
        div = results.collect(mains, "divide")
        parts += ["<h3>The divide kernel against the copy roofline</h3>",
                  _divide_figure(div, figs), _divide_table(div, figs)]
        for f in mains:
            a = results.read_attrs(f)
            if a.get("note"):
                parts.append(note(f"{a['host']}: {a['note']}"))
        parts.append("<h3>Splitting the image over devices</h3>")
        sp = results.collect(mains, "split")
        cols = ["host", "device_kind", "mode", "bytes", "wall_s_median", "wall_s_min", "wall_s_max",
                "gbps", "overlap", "verified"]
        t = sp[cols].copy()
        for c in ("wall_s_median", "wall_s_min", "wall_s_max"):
            t[c] = t[c] * 1e3
        parts.append(figs.table(t.rename(columns={
            "wall_s_median": "wall ms", "wall_s_min": "min", "wall_s_max": "max",
            "gbps": "GB/s (image / wall)", "overlap": "component / execution"}),
            "Split modes: wall time from the first enqueue to the last synchronisation (median, "
            "min-max), image bytes per wall second, and phase overlap per device (>1: overlapped)."))
        for f in mains:
            host = results.read_attrs(f)["host"]
            parts.append(_phase_figure(results.read_table(f, "split_phases"), host, figs))
    for f in aggs:
        a = results.read_attrs(f)
        parts.append(f"<h3>Independent jobs on {esc(a['host'])}</h3>")
        jobs = results.read_table(f, "jobs")
        parts.append(_gantt(jobs, a["host"], figs))
        parts.append(figs.table(results.read_table(f, "summary"),
                                "Independent jobs: count, GPUs on the host, distinct GPU ids used, "
                                "most jobs running at once (processes holding their ids; kernels alone), makespan "
                                "and summed busy time (s)."))
        parts.append(figs.table(jobs[["job", "device_ids", "cuda_visible_devices", "device_name",
                                      "launch_s", "start_s", "end_s", "gbps", "verified"]],
                                "Each job: the GPU ids it held (slot and CUDA_VISIBLE_DEVICES; empty "
                                "on a CPU host), process launch, kernel start and end (s since the first launch) and its "
                                "kernel's GB/s (read + write)."))
    bars = results.collect(mains, outcomes.BARS)
    if len(bars):
        parts.append("<h3>Bars</h3>")
        parts.append(figs.table(bars[["host", "device_kind"] + outcomes.BAR_COLUMNS],
                                "Measured against a reference from elsewhere (source column): ratio = "
                                "measured / reference, pass when it meets the threshold; "
                                "not_applicable, with the reason, where the bar needs hardware this "
                                "host lacks."))
    checks = results.collect(mains + aggs, outcomes.CHECKS)
    if len(checks):
        jobs_checks = checks[checks.check.str.startswith("jobs ")]
        n_fail = int((checks.verdict == outcomes.Verdict.FAIL.value).sum())
        parts.append(f"<p>Checks: {len(checks) - n_fail} of {len(checks)} passed or not applicable"
                     f"{'' if not n_fail else f', <b>{n_fail} failed</b>'}.</p>")
        if len(jobs_checks) or n_fail:
            parts.append(figs.table(checks[checks.check.str.startswith("jobs ")
                                           | (checks.verdict == outcomes.Verdict.FAIL.value)],
                                    "Scheduling checks of the independent jobs, and any failed check."))
    if not parts:
        parts.append(note("No kernels results."))
    return "\n".join(parts)


def headlines(files: list[Path]) -> list[str]:
    mains, aggs = _split(files)
    out = []
    for f in mains:
        a = results.read_attrs(f)
        d = results.read_table(f, "divide")
        big = d[d["size_bytes"] == d["size_bytes"].max()]
        best = big[big.variant != "copy"].sort_values("gbps").iloc[-1]
        copy = big[big.variant == "copy"].iloc[0]
        failed = failed_suffix(a)
        out.append(f"Divide kernel ({best.variant}) on {a.get('device_name')}: {best.gbps:.1f} GB/s "
                   f"(read+write), {100 * best.fraction_of_copy:.0f}% of a same-size copy "
                   f"({copy.gbps:.1f} GB/s).{failed}")
    for f in aggs:
        s = results.read_table(f, "summary").iloc[0]
        host = results.read_attrs(f)["host"]
        if int(s.host_gpus):
            out.append(f"{int(s.jobs)} independent kernel jobs on {host} used "
                       f"{int(s.devices_used)} GPU id(s) of {int(s.host_gpus)}, up to "
                       f"{int(s.max_concurrency)} at once.")
        else:
            out.append(f"{int(s.jobs)} independent kernel jobs on {host} (no GPU: CPU kernel, no "
                       f"GPU ids), up to {int(s.max_concurrency)} at once.")
    return out[:3]


def references(files: list[Path]) -> pd.DataFrame:
    rows = []
    for f in _split(files)[0]:
        a = results.read_attrs(f)
        if a.get("device_kind") != "cuda":
            continue
        for b in results.read_table(f, outcomes.BARS).itertuples():
            if "datasheet" in b.bar and b.verdict != outcomes.Verdict.NOT_APPLICABLE:
                rows.append(outcomes.Reference.of_bar(f"{b.bar} ({b.unit}, read+write)", b))
        d = results.read_table(f, "divide")
        copy = float(d[(d.variant == "copy") & (d.size_bytes == d.size_bytes.max())]["gbps"].iloc[0])
        rows.append(outcomes.Reference.of(
            "same-device copy (GB/s, read+write)", copy, A5000_D2D_GBPS,
            "seed: RTX A5000 p2pBandwidthLatencyTest diagonal (read+write)"))
    return outcomes.references_frame(rows)
