"""Report chapter across hosts and runs: the fleet view and "Against baseline NAME" sections.

Not a stage section: it reads every stage's metrics (:mod:`gpulab.metrics`), and the comparison
tables that ``gpulab compare --json`` wrote (``results/baseline/<host>/<NAME>.json``).
"""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import numpy as np  # noqa: E402

from gpulab import baseline as bl  # noqa: E402
from gpulab import fleet as fl  # noqa: E402
from gpulab.kit.html import Figures, error_box, esc, note  # noqa: E402

METHODS = (
    "<p>Each host of a GPU model is compared with the others of the same model (device kinds and "
    "GPU models are never mixed). Per metric, x is the host's median over its samples and y = ln x "
    "(x itself for counts that can be 0); the fleet median M and the median absolute deviation MAD "
    "of y are taken over the hosts, and the robust z-score is z = 0.6745 (y - M) / max(MAD, {floor}). A host is flagged on a metric when "
    "z is beyond {thr} in the bad direction (lower bandwidth, higher latency) and even its best "
    "sample is worse than M, and the metric is gating (device-side: copies timed on the device, "
    "GEMM, busbw, link and error states, foreign processes); informational metrics (pageable "
    "copies, CPU-side latency, host memcpy) are shown and never flag. At least {minh} hosts are "
    "needed. Hosts whose results are the same machine (hostname and GPU UUIDs) or the same samples "
    "are counted once.</p>")
HEATMAP_METRICS = 40
Z_CLIP = 10.0


def _short(label: str, n: int = 56) -> str:
    return label if len(label) <= n else f"{label[:22]}...{label[-(n - 25):]}"


def _heatmap(dev, group: str, figs: Figures, settings: fl.Settings) -> str:
    g = dev[dev["group"] == group]
    worst = g.groupby("metric")["badness"].apply(lambda s: float(np.nanmax(np.abs(s))))
    keep = list(worst.sort_values(ascending=False).index[:HEATMAP_METRICS])
    m = g[g["metric"].isin(keep)].pivot(index="host", columns="metric", values="badness")
    m = m[keep].clip(-Z_CLIP, Z_CLIP)
    fig, ax = plt.subplots(figsize=(min(2 + 0.28 * len(keep), 16), 1.6 + 0.35 * len(m)))
    sns.heatmap(m, cmap="RdBu_r", center=0, vmin=-Z_CLIP, vmax=Z_CLIP, ax=ax,
                cbar_kws={"label": "robust z, + = worse"})
    ax.set_xticklabels([_short(t.get_text()) for t in ax.get_xticklabels()], fontsize=6, rotation=90)
    ax.set_xlabel("")
    ax.set_ylabel("host")
    shown = f"the {len(keep)} metrics with the largest deviation" if len(worst) > len(keep) else "every metric"
    return figs.figure(fig, f"{group}: deviation of each host from the fleet median, as a robust "
                            f"z-score oriented so that positive (red) is worse, clipped to "
                            f"+-{Z_CLIP:g}; {shown}. Flagged beyond {settings.threshold}.")


def fleet_section(files: list[Path], figs: Figures, settings: fl.Settings = fl.Settings()) -> str:
    samples, hygiene = fl.prepare(files)
    parts = [METHODS.format(floor=settings.mad_floor, thr=settings.threshold, minh=settings.min_hosts)]
    if hygiene.lines():
        parts.append(note("The results themselves: " + "; ".join(
            esc(ln.strip()) for ln in hygiene.lines()) + "."))
    if samples.empty:
        return "\n".join(parts + [note("No result with comparable metrics (transfer, collectives, "
                                       "gemm, probe) yet.")])
    dev = fl.deviations(samples, settings)
    for group, g in dev.groupby("group", sort=True):
        hosts = sorted(g["host"].unique())
        parts.append(f"<h4>{esc(group)}: {len(hosts)} host(s)</h4>")
        if len(hosts) < settings.min_hosts:
            parts.append(note(f"{len(hosts)} host(s) of this kind ({', '.join(hosts)}): the fleet "
                              f"view needs at least {settings.min_hosts}. Copy other hosts' "
                              "results/<stage>/<host>/ trees into results/ (README, 'Fleet')."))
            continue
        parts.append(_heatmap(dev, str(group), figs, settings))
        s = fl.suspects(g)
        if s.empty:
            parts.append(note(f"No suspect host: no metric beyond robust z {settings.threshold} in "
                              "the bad direction."))
            continue
        cols = ["rank", "host", "metric", "unit", "value", "fleet_median", "ratio", "badness", "hosts"]
        parts.append(figs.table(
            s[cols].rename(columns={"badness": "robust z (bad)", "ratio": "x / median",
                                    "value": "host median"}),
            f"{group}: suspect hosts, worst first, with every metric that flags them and by how much "
            "(x / median; robust z oriented so that positive = worse).", max_rows=80))
    return "\n".join(parts)


def baseline_section(comparison: Path, figs: Figures) -> tuple[str, str]:
    """(heading, HTML) of one comparison written by ``gpulab compare --json``; a broken file
    becomes an error box, not a broken report."""
    try:
        return _baseline_section(comparison, figs)
    except Exception as exc:  # noqa: BLE001 - one bad comparison must not take the report down
        return f"Against baseline {comparison.stem}", error_box(f"comparison {comparison}", exc)


def _baseline_section(comparison: Path, figs: Figures) -> tuple[str, str]:
    df = bl.from_json(comparison.read_text())
    name = df.attrs.get("baseline", comparison.stem)
    body = [f"<p>{esc(bl.summary_line(df))}. Verdicts (not pass/fail): regression or improvement "
            "when the two runs' sample ranges do not overlap and the medians differ by more than "
            "the metric's tolerance (max of the floor and k times its run-to-run spread in the "
            "baseline); else same. Only gating metrics fail a comparison; informational ones are "
            "shown. MW p: one-sided Mann-Whitney U p-value, for information.</p>"]
    for line in df.attrs.get("node_state") or []:
        body.append(note(f"Node state: {esc(line)}"))
    changed = df[df["change"] != bl.Change.SAME.value] if "change" in df else df
    if changed.empty:
        body.append(note("Every metric is the same as in the baseline (within noise and tolerance)."))
    else:
        cols = [c for c in ("metric", "cls", "unit", "baseline_median", "current_median", "ratio",
                            "tolerance", "baseline_range", "current_range", "mannwhitney_p", "change")
                if c in changed.columns]
        body.append(figs.table(changed[cols], f"Metrics that changed against baseline {name}.",
                               max_rows=100))
    return f"Against baseline {name} (host {df.attrs.get('host')})", "\n".join(body)
