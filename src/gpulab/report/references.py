"""Reference figures the report compares measurements with.

- Datasheet limits of GPU models, as rows for the report (the figures live in gpulab/limits.yaml).
- The seed's 2x RTX A5000 (NVLink 3) ``p2pBandwidthLatencyTest`` output, parsed into matrices.

Stage sections may use these in their ``references(files)``; the report's comparison chapter shows
them whole.
"""
from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd

from gpulab import limits
from gpulab.outcomes import REFERENCE_COLUMNS

A5000_P2P_FILE = "p2pBandwidthLatencyTest_a5000.txt"
A5000_SOURCE = "seed notes: p2pBandwidthLatencyTest, 2x RTX A5000 + NVLink 3"

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


def parse_p2p_bandwidth_latency(text: str) -> dict[str, pd.DataFrame]:
    """Matrices of a ``p2pBandwidthLatencyTest`` output, keyed by a short name.

    Bandwidth matrices (GB/s): ``uni_p2p_off``, ``uni_p2p_on``, ``bi_p2p_off``, ``bi_p2p_on``;
    latency matrices (us): ``lat_p2p_off_gpu``, ``lat_p2p_off_cpu``, ``lat_p2p_on_gpu``,
    ``lat_p2p_on_cpu``. Rows are the source device, columns the destination.
    """
    titles = [
        (r"Unidirectional P2P=Disabled Bandwidth", "uni_p2p_off"),
        (r"Unidirectional P2P=Enabled Bandwidth", "uni_p2p_on"),
        (r"Bidirectional P2P=Disabled Bandwidth", "bi_p2p_off"),
        (r"Bidirectional P2P=Enabled Bandwidth", "bi_p2p_on"),
        (r"P2P=Disabled Latency", "lat_p2p_off"),
        (r"P2P=Enabled Latency", "lat_p2p_on"),
    ]
    out: dict[str, pd.DataFrame] = {}
    current = None
    header: list[str] | None = None
    rows: dict[str, list[float]] = {}

    def flush():
        if current and header and rows:
            out[current] = pd.DataFrame.from_dict(rows, orient="index", columns=header)

    for line in text.splitlines():
        line = line.strip()
        title = next((key for pat, key in titles if re.match(pat, line)), None)
        if title:
            flush()
            current, header, rows = title, None, {}
            continue
        parts = line.split()
        if not parts or current is None:
            continue
        if parts[0] in ("D\\D", "GPU", "CPU"):
            flush()
            if parts[0] != "D\\D":  # latency blocks have a GPU and a CPU matrix
                current = re.sub(r"_(gpu|cpu)$", "", current) + "_" + parts[0].lower()
            header, rows = parts[1:], {}
        elif header and parts[0].isdigit() and len(parts) == len(header) + 1:
            rows[parts[0]] = [float(v) for v in parts[1:]]
        else:
            flush()
            current, header, rows = None, None, {}
    flush()
    if not out:
        raise ValueError("no bandwidth or latency matrix found in p2pBandwidthLatencyTest output")
    return out


@lru_cache(maxsize=1)
def a5000_p2p() -> dict[str, pd.DataFrame]:
    """The seed's 2x RTX A5000 p2pBandwidthLatencyTest matrices (see :func:`parse_p2p_bandwidth_latency`)."""
    text = resources.files("gpulab.report").joinpath("data", A5000_P2P_FILE).read_text()
    return parse_p2p_bandwidth_latency(text)


_SUMMARY = [
    # matrix, which cells, metric, unit, convention
    ("uni_p2p_off", "diag", "same-device copy (uni)", "GB/s", "cudaMemcpy on one GPU, as reported"),
    ("uni_p2p_on", "off", "GPU-GPU, P2P on (uni)", "GB/s", "one direction, P2P writes"),
    ("uni_p2p_off", "off", "GPU-GPU, P2P off (uni)", "GB/s", "one direction, staged via host"),
    ("bi_p2p_on", "off", "GPU-GPU, P2P on (bi)", "GB/s", "sum of both directions"),
    ("bi_p2p_off", "off", "GPU-GPU, P2P off (bi)", "GB/s", "sum of both directions"),
    ("lat_p2p_on_gpu", "off", "GPU-GPU latency, P2P on", "us", "GPU-side, P2P writes"),
    ("lat_p2p_off_gpu", "off", "GPU-GPU latency, P2P off", "us", "GPU-side"),
]


def a5000_p2p_summary() -> pd.DataFrame:
    """Key A5000 numbers (mean over the matching cells): metric, value, unit, convention, source."""
    mats = a5000_p2p()
    rows = []
    for name, cells, metric, unit, conv in _SUMMARY:
        m = mats[name].to_numpy()
        mask = np.eye(len(m), dtype=bool)
        vals = m[mask] if cells == "diag" else m[~mask]
        rows.append({"metric": metric, "value": float(vals.mean()), "unit": unit,
                     "convention": conv, "source": A5000_SOURCE})
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
