"""Baselines: a small committed file of per-metric medians and samples, and a comparison with it.

File (``baselines/<name>.yaml``, one metric per line so a diff shows what moved)::

    gpulab_baseline: 1
    name: h200-node07
    group: "cuda: NVIDIA H200"          # device kind + GPU model; compared only with the same group
    host: node07
    created_at: ..., provenance: {git_commit, git_dirty, packages, config_hash per stage}
    metrics:
      "transfer/p2p/uni/ce/enabled/src=0/dst=0": {"unit": "GB/s", "better": "higher",
          "cls": "gating", "median": .., "min": .., "max": .., "n": 15, "samples": [...],
          "runs": [median of run 1, of run 2, ...], "spread": 0.012}
    runs: [{results, fingerprint, added_at}, ...]

A baseline holds one or more runs of the same host (``gpulab baseline save NAME DIR1 DIR2 ...``,
or ``--add`` to grow it by the current results). ``samples`` pools every run's repetitions;
``runs`` keeps each run's median and ``spread`` = (max - min) / median of those run medians: the
run-to-run noise of the metric, which the repetitions of one run do not show (clocks, placement
and the host's other work move a whole run).

Comparison, per metric present in both (verdicts: :class:`Change`, not the pass/fail
:class:`~gpulab.outcomes.Verdict`, because "different" has a direction here):

- ``ratio`` = current median / baseline median; ``gain`` = ratio oriented so > 1 is better
  (1 / ratio for lower-is-better metrics such as latency).
- The *noise band* comes from both runs' samples: the two runs are *separated* when their
  [min, max] ranges do not overlap (every current sample worse, or better, than every baseline
  sample). With n >= 4 samples each this is at least as strict as a one-sided Mann-Whitney U test
  at 5 % (non-overlap of 4 vs 4 has p = 1/70); the U test's p-value is shown beside it.
- A difference must also be *relevant*: |gain - 1| > the metric's tolerance =
  max(``floor`` (default 10 %), ``k`` (default 2) x its run-to-run spread), because run-to-run
  shifts move whole runs while each run's samples stay tight, and would otherwise be flagged on
  every unchanged rerun. States read once (the probe's PCIe width, NVLinks up, ECC errors, foreign
  processes) have no such noise: any change counts.
- Only *gating* metrics (:mod:`gpulab.metrics`) fail a comparison; an informational metric's
  change is shown with its verdict and never fails it.
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

FORMAT_VERSION = 1  # runs/spread/cls are optional additions: files without them still load
DEFAULT_TOLERANCE = 0.10
DEFAULT_K = 2.0


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


def _rel_spread(medians: list[float]) -> float:
    """(max - min) / |median| of the run medians; 0 for one run or a zero median."""
    if len(medians) < 2:
        return 0.0
    mid = abs(float(np.median(medians)))
    return (max(medians) - min(medians)) / mid if mid > 0 else 0.0


def summarize(samples: pd.DataFrame) -> dict[str, dict]:
    """Per metric of ONE run: unit, better, class, median, range and samples."""
    out = {}
    for metric, g in samples.groupby("metric", sort=True):
        v = g["value"].to_numpy(float)
        cls = str(g["cls"].iloc[0]) if "cls" in g.columns and pd.notna(g["cls"].iloc[0]) else metmod.GATING
        out[str(metric)] = {"unit": str(g["unit"].iloc[0]), "better": str(g["better"].iloc[0]),
                            "cls": cls, "median": _round(float(np.median(v))),
                            "min": _round(float(v.min())), "max": _round(float(v.max())),
                            "n": int(len(v)), "samples": [_round(float(x)) for x in v],
                            "runs": [_round(float(np.median(v)))], "spread": 0.0}
    return out


def merge(a: dict[str, dict], b: dict[str, dict]) -> dict[str, dict]:
    """The metrics of two baselines' runs pooled: samples joined, run medians listed, spread anew.
    A metric in only one of them keeps only its own runs."""
    out = {}
    for m in sorted(set(a) | set(b)):
        if m not in a or m not in b:
            out[m] = dict(a.get(m) or b[m])
            continue
        e, f = a[m], b[m]
        v = np.asarray(list(e["samples"]) + list(f["samples"]), float)
        runs = list(e.get("runs") or [e.get("median", float(np.median(e["samples"])))]) + \
            list(f.get("runs") or [f.get("median", float(np.median(f["samples"])))])
        out[m] = {**e, "median": _round(float(np.median(v))), "min": _round(float(v.min())),
                  "max": _round(float(v.max())), "n": int(len(v)),
                  "samples": [_round(float(x)) for x in v], "runs": [_round(float(x)) for x in runs],
                  "spread": _round(_rel_spread(runs))}
    return out


def fingerprint(metrics: dict[str, dict]) -> str:
    """Hash of a run's samples: the same results added twice would fake a zero spread."""
    blob = json.dumps({m: e["samples"] for m, e in sorted(metrics.items())}, sort_keys=True)
    return results.config_hash(blob)


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
    head = {k: v for k, v in doc.items() if k != "metrics" and not k.startswith("_")}
    import yaml

    lines = [yaml.safe_dump(head, sort_keys=False, default_flow_style=False, width=100).rstrip(),
             "metrics:"]
    for m, e in doc["metrics"].items():
        lines.append(f"  {json.dumps(m)}: {json.dumps(e)}")
    return "\n".join(lines) + "\n"


def _one_run(results_dir: str | Path, host: str | None) -> tuple[str, str, dict, dict, list[Path]]:
    """(host, group, metrics, run record, files) of one results folder."""
    files = results.find_results(results_dir)
    samples = metmod.collect(files)
    try:
        h = pick_host(samples, host)
    except BaselineError as exc:
        raise BaselineError(f"{results_dir}: {exc}") from None
    mine = samples[samples["host"] == h]
    groups = sorted(mine["group"].unique())
    if len(groups) != 1:
        raise BaselineError(f"{results_dir}: host {h}: results of several device groups {groups}; "
                            "keep one per host")
    mets = summarize(mine)
    run = {"results": str(results_dir), "fingerprint": fingerprint(mets), "added_at": results.now_iso()}
    return h, groups[0], mets, run, files


def _add_run(doc: dict, results_dir, host: str | None) -> dict:
    h, group, mets, run, _ = _one_run(results_dir, host or doc.get("host"))
    if group != doc["group"]:
        raise BaselineError(f"{results_dir}: host {h} has {group!r}, the baseline {doc['group']!r}: "
                            "different GPU models are never pooled")
    if h != doc.get("host"):
        raise BaselineError(f"{results_dir}: results of host {h!r}, the baseline is of host "
                            f"{doc.get('host')!r}: a baseline holds one host's runs (--host)")
    if any(r.get("fingerprint") == run["fingerprint"] for r in doc.get("runs", [])):
        raise BaselineError(f"{results_dir}: the same samples are already in baseline "
                            f"{doc.get('name')!r} (a run added twice would fake a zero run-to-run "
                            "spread); measure again first")
    doc["metrics"] = merge(doc["metrics"], mets)
    doc.setdefault("runs", []).append(run)
    return doc


def build(results_dirs: str | Path | Iterable[str | Path], name: str, host: str | None = None) -> dict:
    """A baseline of one host from one or more results folders (one run each)."""
    dirs = [results_dirs] if isinstance(results_dirs, (str, Path)) else list(results_dirs)
    if not dirs:
        raise BaselineError("no results folder given")
    h, group, mets, run, files = _one_run(dirs[0], host)
    doc = {"gpulab_baseline": FORMAT_VERSION, "name": name, "group": group, "host": h,
           "created_at": results.now_iso(), "provenance": _provenance(files, h),
           "runs": [run], "metrics": mets}
    for d in dirs[1:]:
        _add_run(doc, d, h)
    return doc


def save(results_dir: str | Path | Iterable[str | Path], name: str,
         baselines_dir: str | Path = "baselines", host: str | None = None,
         force: bool = False) -> Path:
    path = path_for(name, baselines_dir)
    if path.exists() and not force:
        raise BaselineError(f"{path} exists; pass --force to replace it (it is a committed reference), "
                            "or --add to add the current results to it as another run")
    doc = build(results_dir, name, host)
    results.atomic_write_text(path, dumps(doc))
    return path


def add(results_dirs: str | Path | Iterable[str | Path], name: str,
        baselines_dir: str | Path = "baselines", host: str | None = None) -> Path:
    """Grow baseline NAME by the runs in ``results_dirs`` (its run-to-run spread with them)."""
    doc = load(name, baselines_dir)
    dirs = [results_dirs] if isinstance(results_dirs, (str, Path)) else list(results_dirs)
    for d in dirs:
        _add_run(doc, d, host)
    path = Path(doc.pop("_path"))
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
    cls: str = metmod.GATING
    tolerance: float = DEFAULT_TOLERANCE
    spread: float = 0.0


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


def tolerance_for(spread: float | None, floor: float = DEFAULT_TOLERANCE, k: float = DEFAULT_K) -> float:
    """max(floor, k x run-to-run spread): a change smaller than the metric's own run-to-run noise
    is no change."""
    sp = float(spread or 0.0)
    return max(floor, k * sp) if math.isfinite(sp) else floor


def compare_one(metric: str, unit: str, better: str, b: Iterable[float], c: Iterable[float],
                tolerance: float = DEFAULT_TOLERANCE, cls: str = metmod.GATING,
                spread: float = 0.0) -> Row:
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
               bool(worse_sep or better_sep), p, change.value, cls,
               0.0 if len(b) == 1 and len(c) == 1 else tolerance, spread)


def compare(doc: dict, current: pd.DataFrame, host: str | None = None,
            tolerance: float = DEFAULT_TOLERANCE, k: float = DEFAULT_K) -> pd.DataFrame:
    """One row per metric (columns of :class:`Row`); raises on another GPU model. ``tolerance`` is
    the floor of each metric's tolerance, ``k`` the multiple of its run-to-run spread."""
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

    def cls_of(m: str, e: dict | None) -> str:
        # the class the extractor gives now; a baseline of an older gpulab has none stored
        if m in now and "cls" in now[m].columns and pd.notna(now[m]["cls"].iloc[0]):
            return str(now[m]["cls"].iloc[0])
        return str((e or {}).get("cls", metmod.GATING))

    for m, e in doc["metrics"].items():
        if m not in now:
            rows.append(Row(m, e.get("unit", ""), e["better"], float(e.get("median", math.nan)), math.nan,
                            math.nan, math.nan, "", "", False, math.nan, Change.MISSING.value,
                            cls_of(m, e), math.nan, float(e.get("spread") or 0.0)))
            continue
        spread = float(e.get("spread") or 0.0)
        rows.append(compare_one(m, e.get("unit", ""), e["better"], e["samples"], now[m]["value"],
                                tolerance_for(spread, tolerance, k), cls_of(m, e), spread))
    for m in sorted(set(now) - set(doc["metrics"])):
        g = now[m]
        rows.append(Row(m, str(g["unit"].iloc[0]), str(g["better"].iloc[0]), math.nan,
                        float(g["value"].median()), math.nan, math.nan, "", "", False, math.nan,
                        Change.NEW.value, cls_of(m, None), math.nan, 0.0))
    df = pd.DataFrame([r.__dict__ for r in rows])
    df.attrs.update(host=h, baseline=doc.get("name"), group=doc["group"], tolerance=tolerance, k=k,
                    runs=len(doc.get("runs") or []) or 1)
    return df


def gating_regressions(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that fail a comparison: gating metrics that regressed."""
    cls = df["cls"] if "cls" in df.columns else pd.Series(metmod.GATING, index=df.index)
    return df[(df["change"] == Change.REGRESSION.value) & (cls == metmod.GATING)]


def _counts(df: pd.DataFrame) -> str:
    counts = df["change"].value_counts()
    return ", ".join(f"{int(counts.get(c.value, 0))} {c.value}" for c in Change
                     if counts.get(c.value, 0)) or "none"


def summary_line(df: pd.DataFrame) -> str:
    cls = df["cls"] if "cls" in df.columns else pd.Series(metmod.GATING, index=df.index)
    k = df.attrs.get("k", DEFAULT_K)
    return (f"host {df.attrs.get('host')} against baseline {df.attrs.get('baseline')!r} "
            f"({df.attrs.get('group')}; {df.attrs.get('runs', 1)} baseline run(s); tolerance per "
            f"metric = max({df.attrs.get('tolerance'):.0%}, {k:g} x its run-to-run spread), 0 for "
            f"states read once): gating: {_counts(df[cls == metmod.GATING])}; informational "
            f"(shown, never fails): {_counts(df[cls != metmod.GATING])}")


def to_json(df: pd.DataFrame) -> str:
    return json.dumps({"attrs": {k: v for k, v in df.attrs.items()},
                       "rows": json.loads(df.to_json(orient="records"))}, indent=1)


def from_json(text: str) -> pd.DataFrame:
    doc = json.loads(text)
    df = pd.DataFrame(doc["rows"])
    df.attrs.update(doc["attrs"])
    return df
