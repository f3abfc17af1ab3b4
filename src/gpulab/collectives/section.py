"""Collectives: library collectives (busbw vs size), NCCL path variants, hand-written all-reduce."""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import sns
import pandas as pd  # noqa: E402

from gpulab import limits, results  # noqa: E402
from gpulab.outcomes import Reference, Verdict, references_frame  # noqa: E402
from gpulab.kit.frames import checks_summary, collect_tagged, host_label  # noqa: E402
from gpulab.kit.html import Figures, esc, note  # noqa: E402

TITLE = "Collective communication"

METHODS = """
<p>One process per device (forked on one node, torchrun across nodes): NCCL on GPUs, gloo on
CPU virtual devices. Library collectives are the <code>torch.distributed</code> calls (all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, broadcast from rank 0, all_to_all_single) on float32 data; torch exposes
all-reduce and broadcast only in place and all-to-all only out of place, all-gather and
reduce-scatter both ways. Bandwidths follow nccl-tests (doc/PERFORMANCE.md): for a collective of
size <i>S</i> bytes taking <i>t</i> seconds, <b>algbw = S/t</b> and <b>busbw = algbw &times;
factor</b>, with factor 2(n&minus;1)/n for all-reduce, (n&minus;1)/n for all-gather, reduce-scatter
and all-to-all, and 1 for broadcast (n ranks). <i>S</i> is the whole array: the gathered output of
all-gather, the input of reduce-scatter, one rank's buffer of all-to-all; per-rank counts are
rounded down to a multiple of n. busbw is what each rank's link carries per direction, so it is
comparable with a link's one-way bandwidth whatever n is; with n = 1 there is no communication and
busbw is 0 by definition (the figures then show algbw). GB/s = 10<sup>9</sup> B/s.</p>
<p>Timing: after one verified call and untimed warm-up, each repetition starts with a barrier and
times a block of back-to-back calls (CUDA events on the current stream on GPU, the host clock on
CPU); the time per call is the block time divided by the calls, and a repetition's time is the
slowest rank's. Tables give the median with min&ndash;max over repetitions. Inputs of in-place
reductions are restored (untimed) before every repetition.</p>
<p>Verification: rank r's data are random integers in [&minus;64, 64] repeating with a prime period
(10<sup>6</sup>+3 elements), so every rank rebuilds every other rank's data and computes the exact
expected result; float32 sums of such integers are exact, so every output element is compared for
equality (the <i>wrong</i> column counts mismatches over all ranks, as nccl-tests' #wrong).</p>
<p>Hand-written all-reduce over point-to-point <code>batch_isend_irecv</code> (each exchange one
NCCL group, so sends and receives progress together): <b>ring</b> = reduce-scatter then all-gather
around the ring r&rarr;r+1, each of the n chunks cut into pipeline slices that move on as soon as
they are reduced (2(n&minus;1) steps); <b>tree</b> = reduce up a binary tree rooted at rank 0, then
broadcast down, slice by slice (a node forwards slice k while it receives slice k+1);
<b>param_server</b> = workers push gradients to rank 0 (which also holds one), the server applies
w &larr; w &minus; &Sigma;g (learning rate 1 keeps integers exact) and every worker pulls w. All
three leave every rank with the sum, so they use the all-reduce busbw factor and are compared with
the library's in-place all-reduce at the same sizes. Path variants rerun the library collectives
with <code>NCCL_ALGO=Ring</code>, <code>NCCL_ALGO=Tree</code> (all-reduce only: NCCL has Tree for
nothing else) and <code>NCCL_P2P_DISABLE=1</code> (GPU traffic staged through host memory);
<code>NCCL_NVLS_ENABLE=0</code> in every run unless the config sets <code>devices.nvls: true</code>.</p>
<p><b>Bars</b>, at the largest size: the library's in-place all-reduce busbw against nccl-tests'
<code>all_reduce_perf</code> (when it is installed) within 5% <i>either way</i> (two bars, &ge;95%
and &le;105%), and the hand-written ring against the library (&ge;70%). Both sides of the
nccl-tests comparison use the same statistic: the per-call time of a block of back-to-back calls
(<code>-n</code> = <code>iters</code>), median over as many blocks as gpulab has repetitions
(<code>-N</code> cycles), busbw by the same formula. The <b>process models differ</b>:
<code>all_reduce_perf -g n</code> drives all n GPUs from one process and one thread (a group call
per step), while gpulab runs one process per GPU whose calls go through
<code>torch.distributed</code>, so per-call launch overheads differ, mostly at small sizes; the
bars use the largest size, where both are bandwidth-bound.</p>
"""


def _label(a: dict) -> str:
    return host_label(a, "world_size", cpu="{n} gloo ranks on CPU")


def _collect(files: list[Path], table: str) -> pd.DataFrame:
    # the 'variants' table names variants itself
    return collect_tagged(((f, results.read_attrs(f)) for f in files), table,
                          lambda a: {"host": _label(a), "variant": a.get("variant", "?")})


def _metric(df: pd.DataFrame) -> tuple[str, str]:
    """busbw where some run had communication, else algbw (world size 1)."""
    if (df["world_size"] > 1).any():
        return "busbw_GBps", "busbw (GB/s)"
    return "algbw_GBps", "algbw (GB/s; world size 1: busbw = 0)"


def _range(df: pd.DataFrame) -> pd.Series:
    us = df[["time_s_median", "time_s_min", "time_s_max"]] * 1e6
    return (us["time_s_median"].map("{:.4g}".format) + " (" + us["time_s_min"].map("{:.4g}".format)
            + "-" + us["time_s_max"].map("{:.4g}".format) + ")")


def _library_figure(lib: pd.DataFrame, host: str, figs: Figures) -> str:
    col, ylab = _metric(lib)
    d = lib.assign(path=lib["variant"] + ", " + lib["mode"])
    d = d[d[col] > 0]
    if d.empty:
        return ""
    g = sns.relplot(data=d, kind="line", x="bytes", y=col, hue="path", col="op", col_wrap=3,
                    marker="o", height=2.8, aspect=1.2, facet_kws={"sharey": False})
    g.set(xscale="log", yscale="log")
    g.set_titles(col_template="{col_name}")
    g.set_axis_labels("size S (bytes)", ylab)
    return figs.figure(g.figure, f"Library collectives on {host}: {ylab} against size S "
                                 "(nccl-tests conventions: algbw = S/t, busbw = algbw x factor; "
                                 "median over repetitions of the slowest rank's per-call time), "
                                 "per path variant and in-place / out-of-place mode.")


def _algorithms_figure(algs: pd.DataFrame, figs: Figures) -> str:
    col, ylab = _metric(algs)
    d = algs[algs[col] > 0]
    if d.empty:
        return ""
    g = sns.relplot(data=d, kind="line", x="bytes", y=col, hue="algorithm", col="host",
                    marker="o", height=3.2, aspect=1.3, facet_kws={"sharey": False})
    g.set(xscale="log", yscale="log")
    g.set_axis_labels("size S (bytes)", ylab)
    return figs.figure(g.figure, f"All-reduce algorithms: {ylab} against size; 'library' is the "
                                 "library's in-place all-reduce, ring / tree / param_server are "
                                 "written by hand over send/recv (all-reduce busbw factor "
                                 "2(n-1)/n for all).")


def render(files: list[Path], figs: Figures) -> str:
    lib = _collect(files, "library")
    parts = []
    if not lib.empty:
        for host, d in lib.groupby("host", sort=False):
            parts.append(_library_figure(d, host, figs))
        top = lib[lib["bytes"] == lib.groupby(["host", "op"])["bytes"].transform("max")]
        t = top[["host", "variant", "op", "mode", "bytes", "world_size"]].assign(**{
            "time us median (min-max)": _range(top), "algbw GB/s": top["algbw_GBps"],
            "busbw GB/s": top["busbw_GBps"], "wrong": top["wrong"]})
        parts.append(figs.table(t, "Library collectives at the largest size of each: per-call "
                                   "time (slowest rank), algbw and busbw (GB/s = 1e9 B/s), "
                                   "wrong elements over all ranks. Every size is in the HDF5 "
                                   "result (table 'library')."))
    algs = _collect(files, "allreduce_algorithms")
    if not algs.empty:
        parts.append(_algorithms_figure(algs, figs))
        top = algs[algs["bytes"] == algs.groupby("host")["bytes"].transform("max")]
        t = top[["host", "algorithm", "bytes", "world_size"]].assign(**{
            "time us median (min-max)": _range(top), "algbw GB/s": top["algbw_GBps"],
            "busbw GB/s": top["busbw_GBps"], "wrong": top["wrong"]})
        if "slices" in top:
            t["pipeline slices"] = top["slices"]
        parts.append(figs.table(t, "All-reduce algorithms at the largest size: library vs "
                                   "hand-written (in place, same sizes, same data)."))
    bars = _collect(files, "bars")
    if not bars.empty:
        parts.append(figs.table(bars.drop(columns=["variant"]),
                                "Bars, measured in the same job (defined with more than one GPU; "
                                "otherwise not applicable, with the reason)."))
    na_rows = _collect(files, "not_applicable")
    if not na_rows.empty:
        parts.append(figs.table(na_rows.drop_duplicates(["host", "what", "reason"])
                                [["host", "variant", "what", "reason"]],
                                "Not measured here, and why."))
    if not parts:
        return "<p>No collectives results.</p>"
    parts.append(_checks(files))
    return "\n".join(p for p in parts if p)


def _checks(files: list[Path]) -> str:
    text = "Verification: " + checks_summary(files, "collective results exact on every rank")
    return note(text) if "failed" in text else f"<p>{esc(text)}</p>"


def _at_largest(df: pd.DataFrame, **match) -> pd.Series | None:
    for k, v in match.items():
        df = df[df[k] == v]
    if df.empty:
        return None
    return df.loc[df["bytes"].idxmax()]


def _bar_verdict(files: list[Path], host: str) -> str:
    """'; <bar>: <verdict>' for the first judged library bar of the host's default result."""
    bars = _collect(files, "bars")
    if bars.empty:
        return ""
    b = bars[(bars["host"] == host) & (bars["variant"] == "default")
             & (bars["verdict"] != Verdict.NOT_APPLICABLE) & bars["bar"].str.startswith("library")]
    if b.empty:
        return ""
    r = b.iloc[0]
    return f" ({r['bar']}: {r['ratio']:.0%}, {r['verdict']})"


def headlines(files: list[Path]) -> list[str]:
    out = []
    lib = _collect(files, "library")
    if not lib.empty:
        lib = lib[lib["variant"] == "default"]
        for host in lib["host"].unique():
            r = _at_largest(lib[lib["host"] == host], op="all_reduce", mode="in-place")
            if r is None:
                continue
            if r["world_size"] > 1:
                out.append(f"Library all-reduce: {r['busbw_GBps']:.4g} GB/s busbw at "
                           f"{r['bytes'] / 2**20:.4g} MiB on {host}{_bar_verdict(files, host)}.")
            else:  # one rank communicates nothing: no bandwidth is claimed (issue 24)
                out.append(f"Library all-reduce on {host}: not applicable (world size 1, no "
                           "communication with one rank).")
    algs = _collect(files, "allreduce_algorithms")
    if not algs.empty:
        for host in algs["host"].unique():
            ring = _at_largest(algs[algs["host"] == host], algorithm="ring")
            ref = _at_largest(algs[algs["host"] == host], algorithm="library")
            if ring is not None and ref is not None and ref["world_size"] > 1 \
                    and ref["busbw_GBps"] > 0:
                out.append(f"Hand-written ring all-reduce: {ring['busbw_GBps']:.4g} GB/s busbw, "
                           f"{100 * ring['busbw_GBps'] / ref['busbw_GBps']:.0f}% of the "
                           f"library's, on {host}.")
    return out[:3]


def references(files: list[Path]) -> pd.DataFrame:
    rows = []
    for f in files:
        a = results.read_attrs(f)
        if a.get("variant") != "default" or "allreduce_algorithms" not in \
                results.list_contents(f)["tables"]:
            continue
        algs = results.read_table(f, "allreduce_algorithms")
        lib = _at_largest(algs, algorithm="library")
        if lib is None or lib["world_size"] < 2:
            continue
        where = f"{_label(a)}, {lib['bytes'] / 2**20:.4g} MiB"
        nccl = a.get("nccl_tests")
        if isinstance(nccl, dict):
            rows.append(Reference.of(f"library all-reduce busbw ({where})", lib["busbw_GBps"],
                                     nccl["ip_busbw_GBps"],
                                     "nccl-tests all_reduce_perf (median over cycles), same job"))
        if a.get("device_kind") == "cuda":
            lim = limits.nvlink_bandwidth(str(a.get("device_name", "")))
            if lim.known:
                rows.append(Reference.of(f"library all-reduce busbw ({where})",
                                         lib["busbw_GBps"], lim.value, lim.source))
        ring = _at_largest(algs, algorithm="ring")
        if ring is not None:
            rows.append(Reference.of(f"hand-written ring all-reduce busbw ({where})",
                                     ring["busbw_GBps"], lib["busbw_GBps"],
                                     "library all-reduce, same run"))
    return references_frame(rows)
