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
- the group has at least ``min_hosts`` hosts (default 3: with two, nobody knows which is sick), and
- the metric is *gating* (:mod:`gpulab.metrics`): an informational metric (pageable copies, CPU-side
  latency, host memcpy) beyond the threshold is listed apart and never flags a host.

Before any of this, :func:`prepare` checks the results themselves: a host whose probe identity
(hostname and GPU UUIDs) or repeated samples equal another's is a duplicate, counted once; a
folder whose label is not the host recorded in its files is named; hosts whose driver, CUDA, torch
or NCCL versions differ from their group's majority are listed.

``ratio`` = x / M says by how much.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpulab import metrics as metmod
from gpulab import results

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
        return pd.DataFrame(columns=["group", "metric", "host", "unit", "better", "cls", "value", "best", "n"])
    # a row without a class gates (the safe default: a sick node must not go unflagged)
    samples = samples.assign(cls=samples["cls"].fillna(metmod.GATING) if "cls" in samples.columns
                             else metmod.GATING)
    g = samples.groupby(["group", "metric", "host"], sort=True)
    out = g.agg(unit=("unit", "first"), better=("better", "first"), cls=("cls", "first"),
                value=("value", "median"),
                hi=("value", "max"), lo=("value", "min"), n=("value", "size")).reset_index()
    out["best"] = np.where(out["better"] == metmod.HIGHER, out["hi"], out["lo"])
    return out.drop(columns=["hi", "lo"])


def deviations(samples: pd.DataFrame, settings: Settings = Settings()) -> pd.DataFrame:
    """Every (group, metric, host) with its fleet median, MAD, robust z, badness, ratio, flagged."""
    h = per_host(samples)
    if h.empty:
        return h.assign(fleet_median=[], mad=[], z=[], badness=[], ratio=[], hosts=[], outlier=[],
                        flagged=[])
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
        g["outlier"] = (bad > settings.threshold) & best_worse & (len(g) >= settings.min_hosts)
        g["flagged"] = g["outlier"] & (g["cls"] == metmod.GATING)
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


def format_text(dev: pd.DataFrame, settings: Settings = Settings(), limit: int = 40,
                hygiene: Hygiene | None = None) -> str:
    lines = []
    if hygiene is not None and hygiene.lines():
        lines += ["== the results themselves:"] + hygiene.lines()
    if dev.empty:
        return "\n".join(lines + ["fleet: no metrics in the results (run the health preset on each "
                                   "host first)"])
    for group, g in dev.groupby("group", sort=True):
        hosts = sorted(g["host"].unique())
        lines.append(f"== {group}: {len(hosts)} host(s): {', '.join(hosts)}; "
                     f"{g['metric'].nunique()} metrics")
        if len(hosts) < settings.min_hosts:
            lines.append(f"   fewer than {settings.min_hosts} hosts: no host is flagged "
                         "(a median of two cannot tell which one is off)")
            continue
        info = g[g["outlier"] & ~g["flagged"]]
        if len(info):
            lines.append(f"   informational (shown, never flags): {len(info)} host x metric beyond "
                         f"{settings.threshold}, e.g. " + "; ".join(
                             f"{r.host} {r.metric} x{r.ratio:.3g}"
                             for r in info.sort_values("badness", ascending=False).head(3).itertuples()))
        s = suspects(g)
        if s.empty:
            lines.append(f"   no suspect host (robust z beyond {settings.threshold} in the bad "
                         "direction on no gating metric)")
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


# ---------------------------------------------------------------- fleet hygiene

# Versions whose differences are a common cause of "slow node" tickets.
VERSION_KEYS = ("nvidia_driver", "cuda_driver", "cuda_runtime", "torch", "torch.cuda", "nccl")


@dataclass
class Hygiene:
    """What is wrong with the fleet's results themselves, before any host is judged."""

    # (label counted once, label dropped as its duplicate, why)
    duplicates: list = field(default_factory=list)
    # (result file, folder label, host recorded in the file)
    mislabelled: list = field(default_factory=list)
    # (group, host, package, its version, the group's majority version)
    versions: list = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for keep, drop, why in self.duplicates:
            out.append(f"   duplicate: {drop} is {keep} again ({why}); counted once, as {keep}")
        for f, label, host in self.mislabelled:
            out.append(f"   mislabelled: {f} lies under label {label!r} but was measured as host "
                       f"{host!r}")
        for group, host, pkg, v, maj in self.versions:
            out.append(f"   version: {host} ({group}) has {pkg} {v}, the majority {maj}")
        return out


def _probe_facts(files) -> dict[str, dict]:
    """{folder label: {identity, versions}} from each probe result (identity: the machine's
    hostname and GPU UUIDs; versions: driver, CUDA, torch, NCCL)."""
    out = {}
    for f, a in results.with_attrs(files, "fleet"):
        label = metmod.folder_label(f, str(a["stage"]))
        facts = out.setdefault(label, {"identity": None, "versions": {}})
        pk = a.get("packages") or {}
        if isinstance(pk, dict):
            facts["versions"].update({k: str(pk[k]) for k in VERSION_KEYS if pk.get(k) not in (None, "None")})
        tabs = results.list_contents(f)["tables"]  # host/software/gpus: the probe's tables
        if "software" in tabs:
            sw = results.read_table(f, "software").set_index("package")["version"]
            facts["versions"].update({k: str(sw[k]) for k in VERSION_KEYS
                                      if k in sw.index and str(sw[k]) not in ("None", "")})
        uuids = []
        if "gpus" in tabs:
            g = results.read_table(f, "gpus")
            uuids = sorted(str(u) for u in g["uuid"]) if "uuid" in g.columns else []
        hostname = ""
        if "host" in tabs:
            h = results.read_table(f, "host").set_index("key")["value"]
            hostname = str(h.get("hostname", ""))
        # GPU UUIDs are unique hardware: with them, (hostname, UUIDs) names one machine. Without
        # GPUs a hostname alone does not: labelled hosts on one CPU machine are how a fleet is
        # rehearsed, so there only identical samples count as a duplicate.
        if uuids:
            facts["identity"] = (hostname, tuple(uuids))
    return out


def _sample_print(g: pd.DataFrame) -> str | None:
    """Hash of a host's repeated samples (states read once agree on every healthy host: left out)."""
    rep = g[g.groupby("metric")["value"].transform("size") > 1]
    if rep.empty:
        return None
    blob = rep.sort_values(["metric", "sample"])[["metric", "value"]].to_json(orient="values")
    return hashlib.sha256(blob.encode()).hexdigest()


def prepare(files) -> tuple[pd.DataFrame, Hygiene]:
    """The fleet's metric samples, each host by the label of its folder, with duplicates counted
    once, and the hygiene findings (duplicates, mislabelled folders, versions off the majority)."""
    files = list(files)
    hy = Hygiene()
    for f, a in results.with_attrs(files, "fleet"):
        label = metmod.folder_label(f, str(a["stage"]))
        if str(a.get("host")) != label:
            hy.mislabelled.append((str(f), label, str(a.get("host"))))
    wrong = {label for _, label, _ in hy.mislabelled}
    samples = metmod.collect(files, by_folder=True)
    facts = _probe_facts(files)
    # Prefer keeping a label whose files say it is that host; then the first in name order.
    hosts = sorted(samples["host"].unique(), key=lambda h: (h in wrong, h))
    seen_id: dict = {}
    seen_print: dict = {}
    drop = set()
    for h in hosts:
        ident = (facts.get(h) or {}).get("identity")
        pr = _sample_print(samples[samples["host"] == h])
        if ident and ident in seen_id:
            hy.duplicates.append((seen_id[ident], h, f"same machine: hostname {ident[0]!r}, GPU UUIDs "
                                  f"{', '.join(ident[1])}"))
            drop.add(h)
        elif pr and pr in seen_print:
            hy.duplicates.append((seen_print[pr], h, "identical samples"))
            drop.add(h)
        else:
            if ident:
                seen_id[ident] = h
            if pr:
                seen_print[pr] = h
    samples = samples[~samples["host"].isin(drop)].reset_index(drop=True)
    for group, g in samples.groupby("group", sort=True):
        members = sorted(g["host"].unique())
        for key in VERSION_KEYS:
            have = {h: (facts.get(h) or {}).get("versions", {}).get(key) for h in members}
            have = {h: v for h, v in have.items() if v}
            if len(have) < 3:
                continue
            counts = pd.Series(list(have.values())).value_counts()
            if len(counts) < 2 or counts.iloc[0] == counts.iloc[1]:
                continue  # all agree, or no majority to name
            maj = str(counts.index[0])
            hy.versions += [(str(group), h, key, v, maj) for h, v in sorted(have.items()) if v != maj]
    return samples, hy
