"""The fleet view: which host of many (same GPU model) is sick, by which metric and by how much.

Per group (device kind + GPU model; groups are never mixed) and metric, each host is summarised by
the median of its samples, x. Against the fleet (every host of the group), on a log scale
(y = ln x, so half and double the bandwidth are equally far from the median):

    M   = median of the hosts' y
    MAD = median |y - M|                     (median absolute deviation)
    z   = 0.6745 * (y - M) / max(MAD, mad_floor)

z is the robust z-score of Iglewicz and Hoaglin (0.6745 makes it comparable to a normal z); it is
not thrown off by the sick host itself the way a mean and standard deviation are. The floor on the
MAD (default 0.02, about 2 % of the median) keeps a fleet whose hosts agree almost exactly from
flagging a host that is a fraction of a percent off. Metrics with values <= 0 (error counts,
all-zero states) use y = x and a floor of mad_floor * |median|. States read once, without
repetitions (the probe's PCIe width, active NVLinks, ECC error counts), have no noise, so their
floor is 0: any deviation from a unanimous fleet in the bad direction flags (one ECC error on a
fleet of zeros, one NVLink down of 18). ``badness`` is z oriented so that positive = worse (lower
bandwidth, higher latency). A host is *flagged* on a metric when

- badness > ``threshold`` (default 3.5, Iglewicz and Hoaglin's outlier cut-off), and
- even the host's best sample is worse than the fleet median (one slow repetition of a healthy
  host is noise, not a sick node), and
- the group has at least ``min_hosts`` hosts (default 3: with two, nobody knows which is sick).

``ratio`` = x / M says by how much.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpulab import metrics as metmod

DEFAULT_THRESHOLD = 3.5
DEFAULT_MAD_FLOOR = 0.02
DEFAULT_MIN_HOSTS = 3
Z_CONST = 0.6745


@dataclass(frozen=True)
class Settings:
    threshold: float = DEFAULT_THRESHOLD
    mad_floor: float = DEFAULT_MAD_FLOOR
    min_hosts: int = DEFAULT_MIN_HOSTS


def per_host(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per (group, metric, host): median and best sample."""
    if samples.empty:
        return pd.DataFrame(columns=["group", "metric", "host", "unit", "better", "value", "best", "n"])
    g = samples.groupby(["group", "metric", "host"], sort=True)
    out = g.agg(unit=("unit", "first"), better=("better", "first"), value=("value", "median"),
                hi=("value", "max"), lo=("value", "min"), n=("value", "size")).reset_index()
    out["best"] = np.where(out["better"] == metmod.HIGHER, out["hi"], out["lo"])
    return out.drop(columns=["hi", "lo"])


def deviations(samples: pd.DataFrame, settings: Settings = Settings()) -> pd.DataFrame:
    """Every (group, metric, host) with its fleet median, MAD, robust z, badness, ratio, flagged."""
    h = per_host(samples)
    if h.empty:
        return h.assign(fleet_median=[], mad=[], z=[], badness=[], ratio=[], hosts=[], flagged=[])
    parts = []
    for (_, _), g in h.groupby(["group", "metric"], sort=True):
        g = g.copy()
        x = g["value"].to_numpy(float)
        m = float(np.median(x))
        log = bool(np.all(x > 0))
        y = np.log(x) if log else x
        my = float(np.median(y))
        mad = float(np.median(np.abs(y - my)))
        floor = settings.mad_floor if log else settings.mad_floor * abs(my)
        if g["n"].max() == 1:
            floor = 0.0  # a state read once (PCIe width, links up): no noise to allow for
        scale = max(mad, floor, 1e-12)
        z = Z_CONST * (y - my) / scale
        higher = g["better"].iloc[0] == metmod.HIGHER
        bad = -z if higher else z
        best_worse = (g["best"] < m) if higher else (g["best"] > m)
        g["fleet_median"], g["mad"], g["z"], g["badness"] = m, mad, z, bad
        g["ratio"] = x / m if m != 0 else np.where(x == 0, 1.0, np.inf)
        g["hosts"] = len(g)
        g["flagged"] = (bad > settings.threshold) & best_worse & (len(g) >= settings.min_hosts)
        parts.append(g)
    return pd.concat(parts, ignore_index=True)


def suspects(dev: pd.DataFrame) -> pd.DataFrame:
    """Flagged (host, metric) rows, worst host first, its worst metric first."""
    f = dev[dev["flagged"]]
    if f.empty:
        return f.assign(rank=[])
    worst = f.groupby(["group", "host"])["badness"].max().rename("host_worst")
    f = f.join(worst, on=["group", "host"]).sort_values(["host_worst", "badness"], ascending=False)
    f["rank"] = f.groupby(["group", "host"], sort=False).ngroup() + 1
    return f.drop(columns=["host_worst"]).reset_index(drop=True)


def flagged_hosts(dev: pd.DataFrame) -> dict[str, list[str]]:
    """{group: [flagged hosts]}."""
    s = suspects(dev)
    return {str(g): list(dict.fromkeys(x["host"])) for g, x in s.groupby("group", sort=False)}


def format_text(dev: pd.DataFrame, settings: Settings = Settings(), limit: int = 40) -> str:
    if dev.empty:
        return "fleet: no metrics in the results (run the health preset on each host first)"
    lines = []
    for group, g in dev.groupby("group", sort=True):
        hosts = sorted(g["host"].unique())
        lines.append(f"== {group}: {len(hosts)} host(s): {', '.join(hosts)}; "
                     f"{g['metric'].nunique()} metrics")
        if len(hosts) < settings.min_hosts:
            lines.append(f"   fewer than {settings.min_hosts} hosts: no host is flagged "
                         "(a median of two cannot tell which one is off)")
            continue
        s = suspects(g)
        if s.empty:
            lines.append(f"   no suspect host (robust z beyond {settings.threshold} in the bad "
                         "direction on no metric)")
            continue
        lines.append(f"   suspect hosts (robust z = 0.6745 (y - median) / max(MAD, "
                     f"{settings.mad_floor}), y = ln(x), flagged beyond {settings.threshold}):")
        lines.append(f"   {'rank':>4}  {'host':<16} {'z(bad)':>8} {'x/median':>9} {'value':>11} "
                     f"{'median':>11}  unit      metric")
        for r in s.head(limit).itertuples():
            lines.append(f"   {r.rank:>4}  {r.host:<16} {r.badness:>8.1f} {r.ratio:>9.3f} "
                         f"{r.value:>11.4g} {r.fleet_median:>11.4g}  {r.unit:<9} {r.metric}")
        if len(s) > limit:
            lines.append(f"   ... and {len(s) - limit} more flagged metric(s)")
    return "\n".join(lines)
