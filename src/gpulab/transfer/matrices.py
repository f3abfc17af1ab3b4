"""Turn tidy peer-to-peer rows into src x dst matrices laid out like p2pBandwidthLatencyTest's tables.

Rows carry ``test`` (uni | bi | latency), ``mechanism`` (ce: copy engine via cudaMemcpyPeerAsync,
sm: copy kernel, memcpy: host memcpy between CPU virtual devices), ``p2p`` (disabled | enabled, or
``host`` on CPU), ``metric`` (bandwidth | latency_gpu | latency_cpu), ``src``, ``dst``, ``value_median``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

_TEST_TITLE = {"uni": "Unidirectional", "bi": "Bidirectional", "latency": ""}


def matrix_name(test: str, mechanism: str, p2p: str, metric: str) -> str:
    parts = [test, mechanism]
    if p2p in ("disabled", "enabled"):
        parts.append(f"p2p_{p2p}")
    parts.append({"bandwidth": "GBps", "latency_gpu": "gpu_us", "latency_cpu": "cpu_us"}[metric])
    return "_".join(parts)


def matrix_title(test: str, mechanism: str, p2p: str, metric: str) -> str:
    """The seed's table heading for this matrix (e.g. 'Unidirectional P2P=Enabled Bandwidth ...')."""
    mech = {"ce": "copy engine", "sm": "SM copy kernel", "memcpy": "host memcpy"}[mechanism]
    p = f"P2P={p2p.capitalize()} " if p2p in ("disabled", "enabled") else ""
    writes = "(P2P Writes) " if p2p == "enabled" else ""
    if metric == "bandwidth":
        return f"{_TEST_TITLE[test]} {p}Bandwidth {writes}Matrix (GB/s), {mech}"
    who = "GPU" if metric == "latency_gpu" else "CPU"
    return f"{p}Latency {writes}Matrix (us), {who}, {mech}"


def build(rows: pd.DataFrame, n: int, label: str = "GPU") -> dict[str, tuple[np.ndarray, dict]]:
    """{name: (n x n medians, attrs)} for every (test, mechanism, p2p, metric) group in ``rows``.

    Cells never measured (e.g. SM copies across devices without peer access) stay NaN.
    """
    out = {}
    labels = [f"{label}{i}" for i in range(n)]
    for (test, mech, p2p, metric), g in rows.groupby(["test", "mechanism", "p2p", "metric"], sort=True):
        m = np.full((n, n), np.nan)
        for r in g.itertuples():
            m[int(r.src), int(r.dst)] = r.value_median
        unit = "GB/s" if metric == "bandwidth" else "us"
        out[matrix_name(test, mech, p2p, metric)] = (m, {
            "unit": unit, "rows": labels, "cols": labels, "title": matrix_title(test, mech, p2p, metric),
            "layout": "row = source device (the one issuing the copy), column = destination",
            "test": test, "mechanism": mech, "p2p": p2p, "metric": metric})
    return out
