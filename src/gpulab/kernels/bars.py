"""The kernels stage's bars (measurements against a reference from elsewhere) and checks.

Divide bars compare different kernels on the same data in the same run (the hand-written kernels
against a same-size copy, against the naive kernel and against ``torch.floor_divide``) and the
copy and the best kernel against the datasheet memory bandwidth. A bar over a launch-bound row
(issuing a call takes the host most of the call's GPU time: small sizes) is not applicable. Bytes
are counted read+write (2 x image) everywhere, which is the traffic the datasheet's memory
bandwidth counts, so like is compared with like. The split bars compare modes of the same work (serial vs pipelined, one device
vs all, one host thread vs one per device). The independent-jobs records are checks (scheduling
did what it should), not performance.
"""
from __future__ import annotations

import pandas as pd

from gpulab import limits, plausible
from gpulab.outcomes import Bar, Check, NotApplicable

COPY_SOURCE = "torch copy_ of the same size on the same device, same run (the roofline)"
RW = "read+write counted (2 x image bytes), as the datasheet memory bandwidth counts"
HBM_THRESHOLD = 0.75  # an H200 SXM reached 0.82 (torch copy) and 0.87 (vec16) of 4.8 TB/s
NO_CUDA = "needs CUDA (CuPy RawKernels); not applicable on CPU"
CPU_SPLIT = "CPU virtual devices: measured for reference, the bar is for GPUs"


def _largest(div: pd.DataFrame) -> pd.DataFrame:
    return div[div["size_bytes"] == div["size_bytes"].max()]


def _gbps(big: pd.DataFrame, variant: str):
    row = big[big.variant == variant]
    return float(row["gbps"].iloc[0]) if len(row) else None


def _launch_bound(big: pd.DataFrame, variants) -> str:
    """Why the largest size's rows of ``variants`` judge the host, not the GPU ("" where none is
    launch-bound): the reason a bar over them is not applicable."""
    if "launch_bound" not in big.columns:
        return ""
    hit = big[big.variant.isin(list(variants)) & big["launch_bound"].fillna(False).astype(bool)]
    if not len(hit):
        return ""
    r = hit.iloc[0]
    return (f"launch-bound at the largest size ({int(r['size_bytes'])} B): queueing one "
            f"{r['variant']} call took {1e6 * r['host_issue_s']:.1f} us of the host for "
            f"{1e6 * r['time_s_median']:.1f} us per call on the GPU, so the figure is the host's "
            f"launch rate, not the kernel's; add a larger kernels.sizes_bytes (the gpu preset "
            f"goes to 1 GiB)")


def divide_bars(kind: str, name: str, div: pd.DataFrame) -> list[Bar]:
    big = _largest(div)
    g = {v: _gbps(big, v) for v in ("copy", "naive", "vec8", "vec16", "torch")}
    pairs = [
        ("vec16 divide vs same-size copy (largest size)", "vec16", "copy", 0.8, COPY_SOURCE,
         "copy = roofline; 0.8 is our target"),
        ("vec8 (seed char_vec) vs naive divide", "vec8", "naive", 1.0,
         "naive divide kernel (one byte per thread), same run", "vectorised loads should not be slower"),
        ("vec16 vs torch.floor_divide", "vec16", "torch", 1.0, "torch.floor_divide, same run",
         "hand-written kernel vs library kernel"),
    ]
    out = []
    for bar, mine, ref, thr, source, note in pairs:
        if kind != "cuda":
            out.append(Bar.not_applicable(bar, NO_CUDA, unit="GB/s"))
        elif g[mine] is None or g[ref] is None:
            out.append(Bar.not_applicable(bar, f"variant {mine if g[mine] is None else ref} was not run "
                                               "(kernels.variants)", unit="GB/s"))
        elif why := _launch_bound(big, (mine, ref)):
            out.append(Bar.not_applicable(bar, why, unit="GB/s", measured=g[mine]))
        else:
            out.append(Bar.measure(bar, g[mine], g[ref], source=source, threshold=thr, unit="GB/s",
                                   note=f"{note}; {RW}"))
    best = big[~big.variant.isin(["copy", "torch", "numpy"])].sort_values("gbps")
    lim = limits.memory_bandwidth(name)
    resident = bool(big["cache_resident"].any()) if "cache_resident" in big.columns else False
    for bar, measured, what, variant in (
            ("same-size copy vs datasheet memory bandwidth", g["copy"], "torch copy_", "copy"),
            ("best divide kernel vs datasheet memory bandwidth",
             best["gbps"].iloc[-1] if len(best) else None,
             f"{best['variant'].iloc[-1]} kernel" if len(best) else "",
             best["variant"].iloc[-1] if len(best) else "")):
        if kind != "cuda":
            out.append(Bar.not_applicable(bar, NO_CUDA if "kernel" in bar else
                                          "the datasheet limit is a GPU's; CPU virtual devices here",
                                          unit="GB/s"))
        elif not lim.known:
            out.append(Bar.not_applicable(bar, lim.reason, unit="GB/s"))
        elif measured is None:
            out.append(Bar.not_applicable(bar, "no hand-written kernel was run (kernels.variants)", unit="GB/s"))
        elif resident:
            out.append(Bar.not_applicable(bar, "the largest size fits in L2: that measures the cache, "
                                               "not memory; add a larger kernels.sizes_bytes", unit="GB/s"))
        elif why := _launch_bound(big, (variant,)):
            out.append(Bar.not_applicable(bar, why, unit="GB/s", measured=measured))
        else:
            out.append(Bar.measure(bar, measured, lim.value, source=lim.source, threshold=HBM_THRESHOLD,
                                   unit="GB/s", note=f"{what} at {int(big['size_bytes'].iloc[0])} B; {RW}"))
    return out


def physical_checks(kind: str, name: str, div: pd.DataFrame, bars: list[Bar]
                    ) -> tuple[list[Bar], list[Check]]:
    """Every divide/copy row (read+write GB/s, not L2-resident) against the datasheet memory
    bandwidth, and the datasheet bars guarded (issue 24): above 1.05 x the limit fails."""
    if kind != "cuda":
        return bars, []
    datasheet = [b for b in bars if "datasheet" in b.bar]
    guarded, checks = plausible.guard_all(datasheet)
    swap = {id(b): g for b, g in zip(datasheet, guarded)}
    rows = div
    if "cache_resident" in rows.columns:
        rows = rows[~rows["cache_resident"].fillna(False).astype(bool)]
    lim = limits.memory_bandwidth(name)
    checks += plausible.row_checks(rows, "gbps", lambda r: lim, lambda r: (
        f"divide {r['variant']}, {int(r['size_bytes'])} B (read+write)"), "GB/s")
    return [swap.get(id(b), b) for b in bars], checks


def _mode(df: pd.DataFrame, **kw):
    sel = df
    for k, v in kw.items():
        sel = sel[sel[k] == v]
    return sel.iloc[0] if len(sel) else None


def split_bars(kind: str, n: int, split_df: pd.DataFrame) -> list[Bar]:
    cuda = kind == "cuda"
    pin = bool(cuda and split_df["pinned"].any())  # compare with pinned buffers where measured
    base = dict(threads="per_device", pinned=pin)
    serial = _mode(split_df, devices=n, chunks=1, **base)
    piped = split_df[(split_df.devices == n) & (split_df.chunks > 1)
                     & (split_df.threads == "per_device") & (split_df.pinned == pin)]
    piped = piped.iloc[0] if len(piped) else None

    def bar(name, measured, reference, source, threshold, unit, note):
        if not cuda:
            return Bar.not_applicable(name, CPU_SPLIT, unit=unit, measured=measured)
        return Bar.measure(name, measured, reference, source=source, threshold=threshold, unit=unit,
                           note=note)

    out = []
    if serial is not None and piped is not None:
        out.append(bar("pipelined (chunked) vs serial copy/compute", piped.gbps, serial.gbps,
                       "serial mode (one chunk per device), same run", 1.0, "GB/s",
                       "overlap of copies and kernels per device"))
    names = ("split over all devices vs one device (speed-up / N)",
             "one host thread per device vs one for all")
    if n < 2 or serial is None:
        why = "needs at least 2 devices" if n < 2 else "no serial mode was measured"
        out += [Bar.not_applicable(b, why) for b in names]
        return out
    one = _mode(split_df, devices=1, chunks=1, **base)
    out.append(bar(names[0], one.wall_s_median / serial.wall_s_median, n,
                   f"ideal speed-up N = {n} (one device, same image, same run)", 0.8, "1",
                   "speed-up = one device's wall time / all devices' wall time"))
    single = _mode(split_df, devices=n, chunks=1, threads="single", pinned=pin)
    out.append(bar(names[1], serial.gbps, single.gbps, "one host thread for all devices, same run",
                   0.95, "GB/s", "serial copies; pinned host memory"))
    return out


def output_checks(div: pd.DataFrame, split_df: pd.DataFrame) -> list[Check]:
    note = "every byte compared with numpy's floor division; outputs start as 255 - answer"
    out = [Check.of("output exact vs numpy", f"divide {r.variant}, {int(r.size_bytes)} B", bool(r.verified),
                    note="the roofline copy: destination equal to its source" if r.variant == "copy"
                    else note) for r in div.itertuples()]
    out += [Check.of("output exact vs numpy", f"split: {r.mode}", bool(r.verified), note=note)
            for r in split_df.itertuples()]
    return out


def job_checks(k: int, gpus: int, used: int, conc: int, kconc: int | None = None
               ) -> tuple[list[Check], list[NotApplicable]]:
    """Did Snakemake and gpulab-slot spread the independent jobs over the GPUs, at the same time?"""
    spread, together = "jobs spread over GPUs", "jobs ran concurrently"
    want = min(k, gpus)
    if gpus == 0:
        why = "CPU host: the jobs got no GPU ids; concurrency is bounded by Snakemake's --cores"
        return ([Check.of(spread, f"{k} jobs", None, value=used, note=why),
                 Check.of(together, f"{k} jobs", None, value=conc, note=why)],
                [NotApplicable(spread, why), NotApplicable(together, why)])
    checks = [Check.of(spread, f"{k} jobs, {gpus} GPU(s)", used >= want, value=used, bound=want,
                       note="distinct GPU ids used vs min(jobs, GPUs): each job should get a GPU "
                            "of its own while one is free")]
    if want < 2:
        why = "needs at least 2 GPUs and 2 jobs"
        checks.append(Check.of(together, f"{k} jobs, {gpus} GPU(s)", None, value=conc, note=why))
        return checks, [NotApplicable(together, why)]
    checks.append(Check.of(together, f"{k} jobs, {gpus} GPU(s)", conc >= want, value=conc, bound=want,
                           note="most job processes running at once vs min(jobs, GPUs); kernels "
                                f"overlapping at most: {kconc if kconc is not None else 'unknown'}"))
    return checks, []
