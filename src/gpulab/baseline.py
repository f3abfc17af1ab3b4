"""Baselines: a small committed file of per-metric medians and samples, and a comparison with it.

File (``baselines/<name>.yaml``, one metric per line so a diff shows what moved)::

    gpulab_baseline: 1
    name: h200-node07
    group: "cuda: NVIDIA H200"          # device kind + GPU model; compared only with the same group
    host: node07
    created_at: ..., provenance: {git_commit, git_dirty, packages, config_hash per stage}
    metrics:
      "transfer/p2p/uni/ce/enabled/src=0/dst=0": {"unit": "GB/s", "better": "higher", "median": ..,
          "min": .., "max": .., "n": 10, "samples": [...]}

Comparison, per metric present in both (verdicts: :class:`Change`, not the pass/fail
:class:`~gpulab.outcomes.Verdict`, because "different" has a direction here):

- ``ratio`` = current median / baseline median; ``gain`` = ratio oriented so > 1 is better
  (1 / ratio for lower-is-better metrics such as latency).
- The *noise band* comes from both runs' samples: the two runs are *separated* when their
  [min, max] ranges do not overlap (every current sample worse, or better, than every baseline
  sample). With n >= 4 samples each this is at least as strict as a one-sided Mann-Whitney U test
  at 5 % (non-overlap of 4 vs 4 has p = 1/70); the U test's p-value is shown beside it.
- A difference must also be *relevant*: |gain - 1| > ``tolerance`` (default 10 %), because
  run-to-run shifts (clocks, placement, other tenants) move whole runs by a few percent while each
  run's samples stay tight, and would otherwise be flagged on every unchanged rerun. States read
  once (the probe's PCIe width, NVLinks up, ECC errors) have no such noise: any change counts.
- regression: separated in the bad direction and beyond the tolerance; improvement: the same in the
  good direction; same: otherwise. A metric in only one of the two is listed as ``missing``/``new``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from gpulab import metrics as metmod
from gpulab import results

FORMAT_VERSION = 1
DEFAULT_TOLERANCE = 0.10


class BaselineError(Exception):
    """A baseline that cannot be used (missing, unreadable, another version or GPU model)."""


class Change(str, Enum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SAME = "same"
    MISSING = "missing"  # in the baseline, not measured now
    NEW = "new"  # measured now, not in the baseline

    def __str__(self) -> str:
        return self.value


def path_for(name: str, baselines_dir: str | Path = "baselines") -> Path:
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise BaselineError(f"baseline name {name!r}: use letters, digits, '-', '_' and '.' only")
    return Path(baselines_dir) / f"{name}.yaml"


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def pick_host(samples: pd.DataFrame, host: str | None) -> str:
    """The host whose results a baseline is about: the one asked for, else the only one present,
    else this host's label."""
    hosts = sorted(samples["host"].unique())
    if not hosts:
        raise BaselineError("no metrics in the results (run the health preset first: "
                            "snakemake --cores all --configfile workflow/presets/health.yaml)")
    if host:
        if host not in hosts:
            raise BaselineError(f"no results of host {host!r} (hosts with results: {', '.join(hosts)})")
        return host
    if len(hosts) == 1:
        return hosts[0]
    here = results.host_name()
    if here in hosts:
        return here
    raise BaselineError(f"results of several hosts ({', '.join(hosts)}); choose one with --host")


def summarize(samples: pd.DataFrame) -> dict[str, dict]:
    out = {}
    for metric, g in samples.groupby("metric", sort=True):
        v = g["value"].to_numpy(float)
        out[str(metric)] = {"unit": str(g["unit"].iloc[0]), "better": str(g["better"].iloc[0]),
                            "median": _round(float(np.median(v))), "min": _round(float(v.min())),
                            "max": _round(float(v.max())), "n": int(len(v)),
                            "samples": [_round(float(x)) for x in v]}
    return out


def _provenance(files: Iterable[Path], host: str) -> dict:
    prov: dict = {"config_hash": {}}
    for f in files:
        a = results.read_attrs(f)
        if str(a.get("host")) != host:
            continue
        prov["config_hash"][str(a.get("stage")) + "/" + str(a.get("variant"))] = a.get("config_hash")
        prov.setdefault("git_commit", a.get("git_commit"))
        prov.setdefault("git_dirty", bool(a.get("git_dirty")))
        pk = a.get("packages") or {}
        if isinstance(pk, dict):
            prov.setdefault("packages", {k: pk[k] for k in ("torch", "torch.cuda", "nccl", "gpulab")
                                         if k in pk})
    return prov


def dumps(doc: dict) -> str:
    """YAML with one metric per line (JSON flow mappings are YAML), so diffs are per metric."""
    head = {k: v for k, v in doc.items() if k != "metrics"}
    import yaml

    lines = [yaml.safe_dump(head, sort_keys=False, default_flow_style=False, width=100).rstrip(),
             "metrics:"]
    for m, e in doc["metrics"].items():
        lines.append(f"  {json.dumps(m)}: {json.dumps(e)}")
    return "\n".join(lines) + "\n"


def build(results_dir: str | Path, name: str, host: str | None = None) -> dict:
    files = results.find_results(results_dir)
    samples = metmod.collect(files)
    h = pick_host(samples, host)
    mine = samples[samples["host"] == h]
    groups = sorted(mine["group"].unique())
    if len(groups) != 1:
        raise BaselineError(f"host {h}: results of several device groups {groups}; keep one per host")
    return {"gpulab_baseline": FORMAT_VERSION, "name": name, "group": groups[0], "host": h,
            "created_at": results.now_iso(), "provenance": _provenance(files, h),
            "metrics": summarize(mine)}


def save(results_dir: str | Path, name: str, baselines_dir: str | Path = "baselines",
         host: str | None = None, force: bool = False) -> Path:
    path = path_for(name, baselines_dir)
    if path.exists() and not force:
        raise BaselineError(f"{path} exists; pass --force to replace it (it is a committed reference)")
    doc = build(results_dir, name, host)
    results.atomic_write_text(path, dumps(doc))
    return path


def load(name_or_path: str | Path, baselines_dir: str | Path = "baselines") -> dict:
    p = Path(name_or_path)
    path = p if p.suffix in (".yaml", ".yml", ".json") or p.exists() else path_for(str(name_or_path), baselines_dir)
    if not path.exists():
        have = sorted(x.stem for x in Path(baselines_dir).glob("*.yaml"))
        raise BaselineError(f"no baseline {path} (baselines in {baselines_dir}/: "
                            f"{', '.join(have) or 'none'}; create one with: gpulab baseline save NAME)")
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BaselineError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or "gpulab_baseline" not in doc:
        raise BaselineError(f"{path}: not a gpulab baseline (no 'gpulab_baseline' version key)")
    if doc["gpulab_baseline"] != FORMAT_VERSION:
        raise BaselineError(f"{path}: baseline format version {doc['gpulab_baseline']!r}, this gpulab "
                            f"reads version {FORMAT_VERSION}; save the baseline again")
    for key in ("group", "metrics"):
        if key not in doc:
            raise BaselineError(f"{path}: missing key {key!r}")
    if not isinstance(doc["metrics"], dict) or not all(
            isinstance(e, dict) and isinstance(e.get("samples"), list) and e.get("better") in
            (metmod.HIGHER, metmod.LOWER) for e in doc["metrics"].values()):
        raise BaselineError(f"{path}: every metric needs 'samples' (a list) and 'better' "
                            "(higher/lower)")
    doc["_path"] = str(path)
    return doc


@dataclass
class Row:
    metric: str
    unit: str
    better: str
    baseline_median: float
    current_median: float
    ratio: float
    gain: float
    baseline_range: str
    current_range: str
    separated: bool
    mannwhitney_p: float
    change: str


def _mannwhitney(b: np.ndarray, c: np.ndarray, worse: bool) -> float:
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:  # scipy comes with scikit-learn; without it the column stays empty
        return math.nan
    if len(b) < 2 or len(c) < 2:
        return math.nan
    # one-sided in the direction the medians moved
    alt = "less" if worse else "greater"
    return float(mannwhitneyu(c, b, alternative=alt).pvalue)


def compare_one(metric: str, unit: str, better: str, b: Iterable[float], c: Iterable[float],
                tolerance: float = DEFAULT_TOLERANCE) -> Row:
    b, c = np.asarray(list(b), float), np.asarray(list(c), float)
    mb, mc = float(np.median(b)), float(np.median(c))
    if mb == 0 and mc == 0:
        ratio = 1.0
    else:
        ratio = mc / mb if mb != 0 else math.inf
    gain = ratio if better == metmod.HIGHER else (1 / ratio if ratio not in (0.0, math.inf) else
                                                 (math.inf if ratio == 0 else 0.0))
    # oriented so that larger = better
    sb, sc = (b, c) if better == metmod.HIGHER else (-b, -c)
    worse_sep = sc.max() < sb.min()
    better_sep = sc.min() > sb.max()
    # a state read once (PCIe width, NVLinks up, ECC errors) has no run-to-run noise
    relevant = abs(gain - 1) > (0.0 if len(b) == 1 and len(c) == 1 else tolerance)
    if worse_sep and relevant and gain < 1:
        change = Change.REGRESSION
    elif better_sep and relevant and gain > 1:
        change = Change.IMPROVEMENT
    else:
        change = Change.SAME
    p = _mannwhitney(sb, sc, worse=gain < 1)
    rng = lambda v: f"{v.min():.4g}..{v.max():.4g}"  # noqa: E731
    return Row(metric, unit, better, mb, mc, ratio, gain, rng(b), rng(c),
               bool(worse_sep or better_sep), p, change.value)


def compare(doc: dict, current: pd.DataFrame, host: str | None = None,
            tolerance: float = DEFAULT_TOLERANCE) -> pd.DataFrame:
    """One row per metric (columns of :class:`Row`); raises on another GPU model."""
    h = pick_host(current, host)
    mine = current[current["host"] == h]
    groups = sorted(mine["group"].unique())
    if doc["group"] not in groups:
        raise BaselineError(f"baseline {doc.get('name')!r} was measured on {doc['group']!r}; host {h} "
                            f"has {', '.join(map(repr, groups))}: different GPU models are never "
                            "compared. Save a baseline for this model.")
    mine = mine[mine["group"] == doc["group"]]
    rows = []
    now = {m: g for m, g in mine.groupby("metric")}
    for m, e in doc["metrics"].items():
        if m not in now:
            rows.append(Row(m, e.get("unit", ""), e["better"], float(e.get("median", math.nan)), math.nan,
                            math.nan, math.nan, "", "", False, math.nan, Change.MISSING.value))
            continue
        rows.append(compare_one(m, e.get("unit", ""), e["better"], e["samples"], now[m]["value"],
                                tolerance))
    for m in sorted(set(now) - set(doc["metrics"])):
        g = now[m]
        rows.append(Row(m, str(g["unit"].iloc[0]), str(g["better"].iloc[0]), math.nan,
                        float(g["value"].median()), math.nan, math.nan, "", "", False, math.nan,
                        Change.NEW.value))
    df = pd.DataFrame([r.__dict__ for r in rows])
    df.attrs.update(host=h, baseline=doc.get("name"), group=doc["group"], tolerance=tolerance)
    return df


def summary_line(df: pd.DataFrame) -> str:
    counts = df["change"].value_counts()
    parts = [f"{int(counts.get(c.value, 0))} {c.value}" for c in Change if counts.get(c.value, 0)]
    return (f"host {df.attrs.get('host')} against baseline {df.attrs.get('baseline')!r} "
            f"({df.attrs.get('group')}; tolerance {df.attrs.get('tolerance'):.0%}): "
            + ", ".join(parts))


def to_json(df: pd.DataFrame) -> str:
    return json.dumps({"attrs": {k: v for k, v in df.attrs.items()},
                       "rows": json.loads(df.to_json(orient="records"))}, indent=1)


def from_json(text: str) -> pd.DataFrame:
    doc = json.loads(text)
    df = pd.DataFrame(doc["rows"])
    df.attrs.update(doc["attrs"])
    return df
