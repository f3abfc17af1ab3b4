"""Health metrics and verdicts in the Prometheus text format, for node_exporter's textfile collector.

Point node_exporter at a folder (``--collector.textfile.directory``) and write ``gpulab.prom`` there
(``gpulab export --format prom --out DIR/gpulab``); the file is written under a temporary name and
renamed, as the collector requires. Series (all gauges):

- ``gpulab_metric_median{host, gpu, model, stage, metric, unit}``: median of a health metric's
  samples (:mod:`gpulab.metrics`: the numbers baselines and the fleet view compare), and
  ``gpulab_metric_samples`` their count;
- ``gpulab_bar_ratio{host, gpu, model, stage, metric}``: measured / reference of each bar, and
  ``gpulab_bar_pass`` 1 (pass) or 0 (fail); a not_applicable bar is not exported;
- ``gpulab_result_verdict{host, gpu, model, stage, variant, verdict}``: 1 for the result's overall
  verdict, 0 for the other two (a state set: alert on ``verdict="fail" == 1``);
- ``gpulab_result_timestamp_seconds{host, stage, variant}``: when the result was written.

``gpu`` is the GPU index a metric belongs to (``gpu=N`` or ``src=N`` in its name), else ``all``.
"""
from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Iterable

import pandas as pd

from gpulab import metrics, outcomes, results
from gpulab.export import gpu_models, model_of

VERDICTS = [v.value for v in outcomes.Verdict]
_GPU = re.compile(r"(?:^|/)(?:gpu|src)=(\d+)(?:/|$)")
_BAR_GPU = re.compile(r"\bGPU(\d+)")

HELP = {
    "gpulab_metric_median": "Median of a gpulab health metric's samples, in the unit of label unit.",
    "gpulab_metric_samples": "Number of samples behind gpulab_metric_median.",
    "gpulab_bar_ratio": "A gpulab bar: measured / reference (pass when it meets the threshold).",
    "gpulab_bar_pass": "A gpulab bar's verdict: 1 pass, 0 fail.",
    "gpulab_result_verdict": "A gpulab result's overall verdict (state set: 1 for the current one).",
    "gpulab_result_timestamp_seconds": "When a gpulab result was written (Unix time).",
}


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _line(name: str, labels: dict, value: float) -> str:
    lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
    return f"{name}{{{lab}}} {_num(value)}"


def gpu_of(metric: str) -> str:
    m = _GPU.search(metric)
    return m.group(1) if m else "all"


def text(files: Iterable[str | Path]) -> str:
    """The textfile-collector file of ``files`` (one block per series name, HELP and TYPE first)."""
    files = list(files)
    readable = list(results.with_attrs(files, "prom"))
    models = gpu_models(readable)
    series: dict[str, list[str]] = {k: [] for k in HELP}
    met = metrics.collect(files)
    if not met.empty:
        for (host, stage, metric, unit), g in met.groupby(["host", "stage", "metric", "unit"],
                                                          sort=True):
            lab = {"host": host, "gpu": gpu_of(metric), "model": models.get(host) or
                   str(g["group"].iloc[0]).split(": ", 1)[-1], "stage": stage, "metric": metric,
                   "unit": unit}
            vals = pd.to_numeric(g["value"], errors="coerce").dropna()
            series["gpulab_metric_median"].append(_line("gpulab_metric_median", lab,
                                                        float(vals.median()) if len(vals) else math.nan))
            series["gpulab_metric_samples"].append(_line("gpulab_metric_samples", lab, len(vals)))
    for f, a in readable:
        host, stage, variant = str(a.get("host")), str(a["stage"]), str(a.get("variant", ""))
        model = model_of(a, models)
        verdict = str(a.get("verdict", ""))
        for v in VERDICTS:
            series["gpulab_result_verdict"].append(_line("gpulab_result_verdict", {
                "host": host, "gpu": "all", "model": model, "stage": stage, "variant": variant,
                "verdict": v}, 1.0 if v == verdict else 0.0))
        t = a.get("finished_at")
        if t:
            ts = dt.datetime.fromisoformat(str(t)).timestamp()
            series["gpulab_result_timestamp_seconds"].append(_line(
                "gpulab_result_timestamp_seconds", {"host": host, "stage": stage, "variant": variant},
                ts))
        if outcomes.BARS in results.list_contents(f)["tables"]:
            bars = results.read_table(f, outcomes.BARS)
            for b in bars.itertuples():
                if b.verdict not in outcomes.JUDGED:
                    continue
                g = _BAR_GPU.search(str(b.bar))  # "..., GPU0": the first GPU a bar names
                lab = {"host": host, "gpu": g.group(1) if g else "all",
                       "model": model, "stage": stage, "metric": str(b.bar)}
                series["gpulab_bar_ratio"].append(_line("gpulab_bar_ratio", lab, float(b.ratio)))
                series["gpulab_bar_pass"].append(_line("gpulab_bar_pass", lab,
                                                       1.0 if b.verdict == outcomes.Verdict.PASS else 0.0))
    out = []
    for name, lines in series.items():
        if lines:
            out += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge", *lines]
    return "\n".join(out) + "\n"


def write(files: Iterable[str | Path], path: str | Path) -> Path:
    """Write the file atomically (the collector must never read a half-written file)."""
    return results.atomic_write_text(path, text(files))
