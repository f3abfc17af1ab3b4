"""Small result files for the export, bundle, Prometheus and findings tests (written with the real
writer, gpulab.results.write, so their layout is exactly a stage's)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from gpulab import energy as eng
from gpulab import outcomes, results
from gpulab.outcomes import Bar, Check


def _write(root: Path, stage: str, host: str, variant: str, kind: str, tables: dict,
           matrices: dict | None = None, attrs: dict | None = None, rel: str | None = None) -> Path:
    r = results.Result(stage=stage, variant=variant, config={"stage": {"x": 1}}, device_kind=kind,
                       attrs=dict(attrs or {}))
    for name, (df, units) in tables.items():
        r.add_table(name, df, units)
    for name, (m, unit) in (matrices or {}).items():
        r.add_matrix(name, m, unit, rows=["GPU0", "GPU1"], cols=["GPU0", "GPU1"])
    path = root / (rel or f"{stage}/{host}/{variant}.h5")
    old = os.environ.get("GPULAB_HOST")
    os.environ["GPULAB_HOST"] = host
    try:
        return results.write(r, path)
    finally:
        if old is None:
            os.environ.pop("GPULAB_HOST", None)
        else:
            os.environ["GPULAB_HOST"] = old


def make_results(root: Path, host: str = "h200a", gpu: str = "NVIDIA H200") -> list[Path]:
    """A probe, a transfer and a gemm result of one GPU host under ``root`` (results/ layout)."""
    probe = _write(root, "probe", host, "main", "cuda", {
        "gpus": (pd.DataFrame({"index": [0], "name": [gpu], "memory_total_bytes": [150_000_000_000],
                               "pcie_gen_max": [5], "pcie_width_max": [16]}), {}),
        "host": (pd.DataFrame({"key": ["cpu_model"], "value": ["AMD EPYC"]}), {}),
    }, attrs={"has_gpus": True}, rel=f"probe/{host}.h5")
    hd = pd.DataFrame({
        "direction": ["H2D", "H2D", "D2H", "D2H"], "memory": ["pinned", "pageable"] * 2,
        "call": ["async"] * 4, "device": [0, 0, 0, 0], "bytes": [1 << 30] * 4, "copies": [4] * 4,
        "bytes_per_sample": [4 << 30] * 4,
        "value_median": [55.3, 7.3, 55.2, 6.9], "value_min": [55.0, 7.0, 55.0, 6.5],
        "value_max": [55.5, 7.5, 55.4, 7.2], "unit": ["GB/s"] * 4,
        "samples_s": [json.dumps([0.0776, 0.0777, 0.0779])] * 4, "verified": [True] * 4,
        "note": ["x"] * 4,
    })
    d2d = pd.DataFrame({"gpu": [0], "bytes": [1 << 30], "bytes_per_sample": [1 << 30],
                        "copies": [1], "value_median": [2000.0],
                        "value_rw_median": [4000.0], "unit": ["GB/s"],
                        "samples_s": [json.dumps([5.37e-4, 5.36e-4])]})
    # 1000 copies of 4.8 GB (read+write) in 1.2 s at 600 W: 4000 GB/s, 0.15 J/GB
    energy = pd.DataFrame([eng.row("same-device copy", "GPU0", "nvml", 4.8, "GB",
                                   eng.Reading(1000, 1.2, 720.0, True))], columns=eng.COLUMNS)
    bars = outcomes.bars_frame([
        Bar.measure("pinned H2D vs PCIe limit, GPU0", 55.3, 63.0, source="PCIe Gen5 x16",
                    threshold=0.75, unit="GB/s"),
    ])
    transfer = _write(root, "transfer", host, "main", "cuda", {
        "host_device": (hd, {"bytes": "B", "samples_s": "s per sample (JSON list)"}),
        "torch_d2d": (d2d, {"value_rw_median": "GB/s (read+write)"}),
        "energy": (energy, outcomes.units_for(energy)),
        "bars": (bars, {}),
        "checks": (outcomes.checks_frame([Check.of("copy verified", "H2D", True)]), {}),
    }, matrices={"bw_uni_enabled": (np.array([[2000.0, 50.1], [49.9, 2000.0]]), "GB/s")},
        attrs={"device_names": [gpu]})
    single = pd.DataFrame({"M": [8192, 8192], "N": [8192, 8192], "K": [8192, 8192],
                           "dtype": ["bf16", "fp32"], "time_s_median": [1.5e-3, 2.2e-2],
                           "tflops_median": [733.0, 50.0],
                           "time_s_samples": [json.dumps([1.5e-3, 1.51e-3])] * 2})
    gemm = _write(root, "gemm", host, "main", "cuda", {
        "single": (single, {"time_s_median": "s", "tflops_median": "TFLOP/s"}),
        "bars": (outcomes.bars_frame([Bar.measure("single-device GEMM bf16 8192^3 vs datasheet "
                                                  "dense peak", 733.0, 989.5, source="datasheet",
                                                  threshold=0.6, unit="TFLOP/s")]), {}),
    })
    return [probe, transfer, gemm]
