"""Reference figures the report compares measurements with.

- Datasheet limits of GPU models, as rows for the report (the figures live in gpulab/limits.yaml).
- The seed's 2x RTX A5000 ``p2pBandwidthLatencyTest`` matrices (:mod:`gpulab.seedref`), summarised.

Stage sections may use these in their ``references(files)``; the report's comparison chapter shows
them whole.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from gpulab import limits, seedref
from gpulab.outcomes import REFERENCE_COLUMNS


def datasheets() -> pd.DataFrame:
    """Every limit in :mod:`gpulab.limits` (the one table of them) as rows: gpu, metric, value, unit,
    source; PCIe per direction for an x16 link of each generation."""
    rows = []
    for m in limits.table()["models"]:
        rows.append((m["model"], "memory bandwidth", m.get("memory_gbps"), "GB/s", m["source"]))
        for dtype, v in (m.get("tflops") or {}).items():
            rows.append((m["model"], f"{dtype} dense peak", v, "TFLOP/s", m["source"]))
        rows.append((m["model"], "NVLink per direction", m.get("nvlink_gbps_per_direction"), "GB/s",
                     m["source"]))
    for gen in sorted(limits.table()["pcie_gbps_per_lane"]["gen"]):
        lim = limits.pcie_bandwidth(gen, 16)
        rows.append((f"PCIe Gen{gen} x16", "per direction", lim.value, "GB/s", lim.source))
    df = pd.DataFrame(rows, columns=["gpu", "metric", "value", "unit", "source"])
    return df.dropna(subset=["value"]).reset_index(drop=True)


def datasheet(gpu_name: str) -> dict[str, tuple[float, str]]:
    """Datasheet limits of the model named in ``gpu_name`` (e.g. 'NVIDIA H200'), {} if unknown."""
    m = limits.model_of(gpu_name)
    if m is None:
        return {}
    ds = datasheets()
    return {r.metric: (float(r.value), r.unit) for r in ds[ds["gpu"] == m["model"]].itertuples()}


def a5000_p2p() -> dict[str, pd.DataFrame]:
    """The seed's 2x RTX A5000 p2pBandwidthLatencyTest matrices (:mod:`gpulab.seedref`), labelled
    by device number: rows the source, columns the destination."""
    out = {}
    for name, m in seedref.seed_reference().items():
        labels = [str(i) for i in range(len(m))]
        out[name] = pd.DataFrame(m, index=labels, columns=labels)
    return out


_SUMMARY = [
    # matrix, which cells, metric, unit, convention
    ("uni_ce_p2p_disabled_GBps", "diag", "same-device copy (uni)", "GB/s", "cudaMemcpy on one GPU, as reported"),
    ("uni_ce_p2p_enabled_GBps", "off", "GPU-GPU, P2P on (uni)", "GB/s", "one direction, P2P writes"),
    ("uni_ce_p2p_disabled_GBps", "off", "GPU-GPU, P2P off (uni)", "GB/s", "one direction, staged via host"),
    ("bi_ce_p2p_enabled_GBps", "off", "GPU-GPU, P2P on (bi)", "GB/s", "sum of both directions"),
    ("bi_ce_p2p_disabled_GBps", "off", "GPU-GPU, P2P off (bi)", "GB/s", "sum of both directions"),
    ("latency_ce_p2p_enabled_gpu_us", "off", "GPU-GPU latency, P2P on", "us", "GPU-side, P2P writes"),
    ("latency_ce_p2p_disabled_gpu_us", "off", "GPU-GPU latency, P2P off", "us", "GPU-side"),
]


def a5000_p2p_summary() -> pd.DataFrame:
    """Key A5000 numbers (mean over the matching cells): metric, value, unit, convention, source."""
    mats = seedref.seed_reference()
    rows = []
    for name, cells, metric, unit, conv in _SUMMARY:
        m = mats[name]
        mask = np.eye(len(m), dtype=bool)
        vals = m[mask] if cells == "diag" else m[~mask]
        rows.append({"metric": metric, "value": float(vals.mean()), "unit": unit,
                     "convention": conv, "source": seedref.SEED_SOURCE})
    return pd.DataFrame(rows)


def normalize_references(df: pd.DataFrame) -> pd.DataFrame:
    """A section's ``references`` table (:class:`gpulab.outcomes.Reference` rows) checked and
    completed (fraction = measured / reference where a row has none)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"references() must return a DataFrame, got {type(df).__name__}")
    missing = [c for c in REFERENCE_COLUMNS if c != "fraction" and c not in df.columns]
    if missing:
        raise ValueError(f"references() table lacks column(s) {missing} (has {list(df.columns)})")
    df = df.copy()
    measured = pd.to_numeric(df["measured"], errors="coerce")
    reference = pd.to_numeric(df["reference"], errors="coerce")
    computed = measured / reference.where(reference != 0)
    if "fraction" not in df.columns:
        df["fraction"] = computed
    else:
        df["fraction"] = pd.to_numeric(df["fraction"], errors="coerce").fillna(computed)
    return df
