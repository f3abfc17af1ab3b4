"""Comparable metrics with their samples, read from result files (for baselines and the fleet view).

A *metric* is one measured quantity that means the same thing on every host and in every run of
the same configuration, e.g. ``transfer/p2p/uni/ce/enabled/src=0/dst=1`` (GB/s, higher is better).
Each comes with every repetition's value (its *samples*), so comparisons can respect noise.

Each stage owns how its tables become metrics: its :class:`~gpulab.stages.StageSpec` names an
extractor (``gpulab.<stage>.metrics:extract``), loaded here by name, so this module imports no stage
(the stages sit above it) and lists no stage name.

Every metric is classed (:data:`GATING` or :data:`INFORMATIONAL`, decided by its stage's extractor):

- gating: device-side quantities that a sick node moves and a healthy rerun does not (HBM and
  pinned PCIe copies per GPU, GEMM per GPU, GPU-side latency, P2P/NVLink, all-reduce busbw, error
  counters, link width and generation, clocks, foreign processes on a GPU). On a CPU host the CPU
  "device" measurements gate: copies between virtual devices, the GEMM, the all-reduce across ranks;
- informational: host-side quantities that move run to run with what the host's CPU and page
  cache do (pageable copies, CPU-side latency, host memcpy and thread scaling, allocation times).
  They are shown, and never fail ``gpulab compare`` or ``gpulab fleet --fail-on-suspect``.

Every metric row also carries the host, the device kind and the *group* (device kind + GPU model):
hosts are compared only within a group.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from gpulab import results

COLUMNS = ["group", "host", "stage", "metric", "unit", "better", "cls", "sample", "value"]
HIGHER, LOWER = "higher", "lower"
GATING, INFORMATIONAL = "gating", "informational"

# extract(path, attrs, group) -> rows (see rows())
Extractor = Callable[[Path, dict, str], list]


def json_list(v) -> list[float]:
    """A JSON list of numbers (or a list) as floats; [] where it is neither."""
    if isinstance(v, (list, tuple)):
        return [float(x) for x in v]
    try:
        return [float(x) for x in json.loads(v)]
    except (TypeError, ValueError):
        return []


def rows(group, host, stage, metric, unit, better, values, cls: str = GATING) -> list[dict]:
    """Metric rows (columns :data:`COLUMNS`), one per finite sample."""
    return [{"group": group, "host": host, "stage": stage, "metric": metric, "unit": unit,
             "better": better, "cls": cls, "sample": i, "value": float(v)}
            for i, v in enumerate(values) if v is not None and math.isfinite(float(v))]


def extractors() -> dict[str, Extractor]:
    """{stage: extract function} of every registered stage that declares one."""
    from gpulab import stages

    return {name: stages.hook(spec.metrics) for name, spec in stages.STAGES.items() if spec.metrics}


def _models(a: dict) -> list[str]:
    for key in ("device_names", "gpu_names", "device_name"):
        v = a.get(key)
        if v:
            return [str(x) for x in (v if isinstance(v, list) else [v])]
    return []


def group_of(device_kind: str, models: Iterable[str]) -> str:
    """'cuda: NVIDIA H200' / 'cpu: CPU virtual devices': hosts are compared only within a group."""
    if device_kind != "cuda":
        return f"{device_kind}: CPU virtual devices"
    names = sorted(set(models))
    return f"cuda: {' + '.join(names) if names else 'unknown GPU'}"


def _probe_models(files: list[tuple[Path, dict]]) -> dict[str, list[str]]:
    """GPU names per host from the probe results (for results that do not name their GPUs)."""
    out = {}
    for f, a in files:
        if a.get("has_gpus") and "gpus" in results.list_contents(f)["tables"]:
            g = results.read_table(f, "gpus")
            if "name" in g.columns:
                out[str(a.get("host"))] = [str(n) for n in g["name"]]
    return out


def folder_label(path: str | Path, stage: str) -> str:
    """The host label a result's place names: results/<stage>/<label>/<variant>.h5, or
    results/probe/<label>.h5 (a result folder copied under another label keeps its file's host)."""
    p = Path(path)
    return p.stem if p.parent.name == stage else p.parent.name


def collect(files: Iterable[str | Path], by_folder: bool = False) -> pd.DataFrame:
    """Every metric sample of the given result files (columns :data:`COLUMNS`). ``by_folder``: each
    file's host is the label of the folder it lies in, not the host recorded in it (the fleet view
    names the two when they differ)."""
    readable = list(results.with_attrs(files, "metrics"))
    if by_folder:
        readable = [(f, {**a, "host": folder_label(f, str(a["stage"]))}) for f, a in readable]
    probe_models = _probe_models(readable)
    fns = extractors()
    out: list[dict] = []
    for f, a in readable:
        fn = fns.get(str(a["stage"]))
        if fn is None:
            continue
        kind = str(a.get("device_kind") or ("cuda" if a.get("has_gpus") else "cpu"))
        models = probe_models.get(str(a.get("host"))) or _models(a)
        out += fn(f, a, group_of(kind, models))
    return pd.DataFrame(out, columns=COLUMNS)


def find(results_dir: str | Path = "results") -> pd.DataFrame:
    return collect(results.find_results(results_dir))
