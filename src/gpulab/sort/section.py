"""Multi-device sorting: baselines, P2P merge sort, HET sort, radix-partition sort (issue 7)."""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import pandas as pd  # noqa: E402

from gpulab import results  # noqa: E402
from gpulab.outcomes import Verdict  # noqa: E402
from gpulab.kit.frames import (BAR_SHOWN, bar_references, checks_summary,  # noqa: E402
                              collect_labelled, host_label)
from gpulab.kit.html import Figures, esc  # noqa: E402

TITLE = "Multi-device sorting"

METHODS = """
<p>Keys are uint32, uint64 or float32, drawn from seven distributions (uniform over the full range,
floats in [&minus;1,&nbsp;1); normal; zipf with exponent 1.5; sorted; reverse-sorted; all equal;
16 distinct values). Input starts in host memory (page-locked on CUDA) and the sorted output ends
there: <b>host-to-host</b> times include H2D and D2H and are wall-clock times with every device
synchronised at phase boundaries (the phase breakdown: H2D, local sort, pivot search / splitter
selection, partition, exchange (P2P swap or all-to-all), merge, D2H). Single-device baselines
sort keys already on the device (<b>device</b> scope, CUDA events): <code>cupy.sort</code> (CUB radix
sort, keys only), <code>torch.sort</code> (values and int64 indices), and <code>numpy.sort</code>
on the host. Throughput = keys / median time. Interconnect traffic counts keys that cross from one
device to another, each direction counted (a P2P swap of k keys moves 2k); bytes = keys &times; key
size. Medians with min/max over the repetitions after warm-up.</p>
<p><b>P2P merge sort</b> (Maltenberger et al., SIGMOD 2022): each device sorts its chunk; two
sorted sequences L and R (each on one or more devices) merge by the leftmost pivot k (a binary
search over both sequences for the smallest k with L[|L|&minus;k&minus;1] &le; R[k], so the fewest
keys move), a device-to-device swap of the last k keys of L with the first k of R, and a local
merge; groups of devices merge bottom-up over a balanced binary tree (2 devices: one step; 4: pairs,
cross, pairs as in the paper; 8 and other counts recursively), chunk sizes never change.
<b>HET sort</b>: the devices sort, the CPU merges the sorted runs (multiway merge cut into key
ranges, one thread each). <b>Radix-partition sort</b> (after RMG sort): the D&minus;1 boundary keys
are found exactly by a distributed radix select (16-bit histograms summed over devices, refined
inside the boundary's bucket until all bits are fixed); keys equal to a boundary key are split by
occurrence, so every device receives exactly its chunk whatever the skew; one all-to-all exchange,
then a local sort. The same code runs over CPU virtual devices (numpy arrays, one host thread per
device) and CUDA devices (CuPy, peer copies). Every run is verified: sorted, same multiset as the
input (count and a wrapping 64-bit sum of a splitmix64 hash of every key), and equal to numpy's
sort up to the configured size.</p>
<p><b>Bars</b>: per algorithm, the host-to-host speed-up on the most GPUs against the same algorithm
on the same keys on one GPU in the same run (ratio = efficiency = speed-up / P; not applicable on
CPU virtual devices, which share the host's cores). <b>Checks</b>: every output verified; the keys
the P2P merges move are counted from the keys themselves (distinct keys tagged with their origin
device: a key that ends on another device moved), and compared with what the pivots claim (2k per
step: equal on two devices, a lower bound on more, where a key may cross twice). Timing
<code>P2PMerge.sort</code> on one device against <code>cupy.sort</code> runs the same CUB kernel on
both sides: it is a <b>harness overhead check</b> (gpulab's call path vs the raw library call, same
kernel), not a performance result.</p>
"""

def _label(a: dict) -> str:
    return host_label(a, "devices_available", cpu="{n}x CPU virtual devices")


def _collect(files: list[Path], table: str) -> pd.DataFrame:
    return collect_labelled(files, table, _label)


def _config(df: pd.DataFrame) -> pd.Series:
    multi = df["algorithm"].isin(["p2p", "het", "radix"])
    return df["algorithm"].where(~multi, df["algorithm"] + " x" + df["devices"].astype(str))


def _order(configs) -> list[str]:
    """Baselines first, then each algorithm by device count."""
    def key(c):
        name, _, n = c.partition(" x")
        return (n != "", name, int(n) if n else 0)
    return sorted(set(configs), key=key)


def _sweep_figure(runs: pd.DataFrame, figs: Figures) -> str:
    d = runs[runs["sweep"] == "size"].copy()
    if d.empty:
        return ""
    d["config"] = _config(d)
    d["Gkeys/s"] = d["keys_per_s"] / 1e9
    g = sns.relplot(data=d, x="n_keys", y="Gkeys/s", hue="config", style="scope", col="host",
                    hue_order=_order(d["config"]),
                    kind="line", marker="o", height=3.4, aspect=1.4,
                    facet_kws={"sharey": False})
    g.set(xscale="log", yscale="log")
    g.set_axis_labels("keys", "throughput (Gkeys/s)")
    kt = d["key_type"].iloc[0]
    return figs.figure(g.figure, f"Sort throughput vs input size ({kt}, uniform keys): keys / "
                                 "median time. host-to-host includes H2D and D2H; device = keys "
                                 "already on the device; xN = algorithm on N devices.")


def _phase_figure(phases: pd.DataFrame, figs: Figures) -> str:
    d = phases[phases["sweep"] == "size"]
    if d.empty:
        return ""
    d = d[d["n_keys"] == d.groupby("host")["n_keys"].transform("max")].copy()
    d["config"] = _config(d)
    wide = d.pivot_table(index=["host", "config"], columns="phase", values="time_s_median",
                         aggfunc="sum").fillna(0.0) * 1e3
    order = [p for p in ("h2d", "local_sort", "pivot_search", "partition", "exchange", "merge",
                         "d2h") if p in wide.columns]
    hosts = list(dict.fromkeys(wide.index.get_level_values(0)))
    fig, axes = plt.subplots(1, len(hosts), figsize=(5.5 * len(hosts), 3.6), squeeze=False)
    colors = sns.color_palette("tab10", len(order))
    for ax, h in zip(axes[0], hosts):
        w = wide.loc[h, order]
        w.plot(kind="barh", stacked=True, ax=ax, color=colors, legend=ax is axes[0][-1])
        ax.set_xlabel("time (ms, median per phase)")
        ax.set_ylabel("")
        ax.set_title(h, fontsize=9)
    if len(order):
        axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    n = int(d["n_keys"].max())
    return figs.figure(fig, f"Phase breakdown of the host-to-host sorts at {n} keys (uniform): "
                            "median time of each phase in ms (phases separated by device "
                            "synchronisation).")


def _matrix_figure(runs: pd.DataFrame, figs: Figures) -> str:
    d = runs[(runs["sweep"] == "matrix")].copy()
    if d.empty:
        return ""
    d["config"] = _config(d)
    d["Mkeys/s"] = d["keys_per_s"] / 1e6
    g = sns.catplot(data=d, kind="bar", x="distribution", y="Mkeys/s", hue="config",
                    hue_order=_order(d["config"]),
                    col="key_type", row="host", height=3.0, aspect=1.5, sharey=False)
    g.set_xticklabels(rotation=30)
    g.set_axis_labels("", "throughput (Mkeys/s)")
    n = int(d["n_keys"].iloc[0])
    return figs.figure(g.figure, f"Throughput per key type and distribution at {n} keys "
                                 "(keys / median time; baselines device-resident, algorithms "
                                 "host-to-host).")


def _traffic_table(runs: pd.DataFrame, figs: Figures) -> str:
    d = runs[(runs["algorithm"].isin(["p2p", "radix"])) & (runs["devices"] > 1)]
    if d.empty:
        return ("<p class=\"note\">Interconnect traffic: not applicable (no run on two or more "
                "devices).</p>")
    d = d.assign(moved_fraction=d["keys_moved"] / d["n_keys"])
    t = d.pivot_table(index=["host", "key_type", "distribution", "n_keys"],
                      columns=["algorithm", "devices"], values="moved_fraction").reset_index()
    t.columns = [" ".join(str(x) for x in c if str(x)) if isinstance(c, tuple) else c
                 for c in t.columns]
    return figs.table(t, "Keys moved across the interconnect as a fraction of all keys (each "
                         "direction counted): P2P moves only what the leftmost pivots require "
                         "(0 for sorted input); radix partition moves every key not already on its "
                         "final device.")


def render(files: list[Path], figs: Figures) -> str:
    runs = _collect(files, "runs")
    if runs.empty:
        return "<p>No sort results.</p>"
    parts = []
    parts.append(f"<p>{len(runs)} timed configurations. Verification: "
                 f"{esc(checks_summary(files, 'sort checks verified'))}</p>")
    bars = _collect(files, "bars")
    if not bars.empty:
        parts.append(figs.table(bars[BAR_SHOWN],
                                "Bars: multi-device speed-up against the same work on one device "
                                "in the same run (ratio = efficiency = speed-up / P)."))
    checks = _collect(files, "checks")
    if not checks.empty:
        special = checks[checks["check"].str.startswith(("harness overhead", "P2P keys moved"))]
        if len(special):
            parts.append(figs.table(special[["host", "check", "case", "value", "bound", "verdict",
                                             "note"]],
                                    "Keys moved by P2P merges counted from origin tags against "
                                    "the pivots' claim, and the harness overhead check (not a "
                                    "performance result: the same CUB kernel on both sides)."))
    parts += [_sweep_figure(runs, figs), _phase_figure(_collect(files, "phases"), figs),
              _matrix_figure(runs, figs), _traffic_table(runs, figs)]
    bal = _collect(files, "radix_balance")
    bal = bal[bal["devices"] > 1] if not bal.empty else bal
    if not bal.empty:
        parts.append(figs.table(bal, "Radix-partition sort: histogram passes of the splitter "
                                     "search, keys equal to a boundary key (split by occurrence), "
                                     "keys moved. Every device received exactly its chunk size."))
    logic = _collect(files, "logic_check")
    if not logic.empty:
        ok = bool(logic["verified"].astype(bool).all())
        parts.append(f"<p>Correctness beyond the devices present: {len(logic)} runs of the "
                     "algorithms on 2-4 logical devices (sharing the GPUs round-robin, or extra CPU "
                     f"virtual devices; not timed): {'all verified' if ok else '<b>FAILED</b>'}."
                     "</p>")
    skipped = _collect(files, "not_applicable")
    if not skipped.empty:
        parts.append(figs.table(skipped, "Not measured, and why."))
    fails = _collect(files, "failures")
    if not fails.empty:
        parts.append(figs.table(fails.drop(columns=["traceback"], errors="ignore"),
                                "Configurations that raised an error (see the HDF5 result)."))
    return "\n".join(p for p in parts if p)


def _gk(x: float) -> str:
    return f"{x / 1e9:.2f} Gkeys/s" if x >= 1e8 else f"{x / 1e6:.0f} Mkeys/s"


# Headlines report one fixed, named configuration (issue 24), never the best of several: the
# project's own P2P merge sort, uint32 keys, at the most devices and the largest input run.
HEADLINE_ALGORITHM = "p2p"
HEADLINE_KEYS = "uint32"


def _fixed(df: pd.DataFrame, column: str, wanted: str) -> pd.DataFrame:
    """Rows whose ``column`` is ``wanted``, else those of its first value in stored order."""
    values = list(dict.fromkeys(df[column]))
    return df[df[column] == (wanted if wanted in values else values[0])] if values else df


def headlines(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        a = results.read_attrs(f)
        names = results.list_contents(f)["tables"]
        if "bars" in names:
            b = results.read_table(f, "bars")
            b = b[b["verdict"] != Verdict.NOT_APPLICABLE]
            if len(b):
                fixed = b[b["bar"].str.startswith(f"{HEADLINE_ALGORITHM} ")]
                r = (fixed if len(fixed) else b).iloc[0]
                failed = int((b["verdict"] == Verdict.FAIL).sum())
                out.append(f"{r['bar']}: {r['measured']:.2f}x ({r['ratio']:.0%} efficiency; "
                           f"bar {r['threshold']:.0%}: {r['verdict']})."
                           + (f" Failed bars: {failed} of {len(b)}." if failed else ""))
        runs = results.read_table(f, "runs")
        host = runs[(runs["scope"] == "host-to-host") & (runs["sweep"] == "size")]
        if len(host):
            top = _fixed(_fixed(host, "algorithm", HEADLINE_ALGORITHM), "key_type", HEADLINE_KEYS)
            top = top[top["n_keys"] == top["n_keys"].max()]
            r = top[top["devices"] == top["devices"].max()].iloc[0]
            out.append(f"Host-to-host sort of {int(r['n_keys'])} {r['key_type']} keys "
                       f"({r['distribution']}) on {_label(a)}: {r['algorithm']} on "
                       f"{int(r['devices'])} device(s), {_gk(r['keys_per_s'])}. "
                       f"{checks_summary([f], 'sort checks verified')}")
    return out[:3]


def references(files: list[Path]) -> pd.DataFrame:
    """Multi-device speed-ups against the same work on one device."""
    return bar_references(_collect(files, "bars"))
