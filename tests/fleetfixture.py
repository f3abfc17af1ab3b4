"""Fixture results of a CPU fleet, written as real result files (the stages' own row builders and
result format), with the noise a shared 2-core VM shows and one host degraded.

Figures are those of the real CPU measurements (tests/healthmeasure.py on this machine): copies
between the two virtual devices 12-18 GB/s, fp32 GEMM 768^3 ~0.022 TFLOP/s, 16-byte CPU-side
latency ~0.25 us, host memcpy ~13 GB/s. Noise: each run of a host is shifted as a whole (sd 3 %)
and its repetitions scatter (3 %); host-side (informational) figures swing much more, and one
healthy "noisy neighbour" host per fleet has its CPU-side latency and host memcpy 2-3.5x off, as
the 5-host CPU fleet of issue 25 showed (0.38 vs 0.21 us). The degraded host (pinned to one core
that busy loops share) does everything 3-8x slower.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from gpulab import results
from gpulab.transfer.measure import bandwidth_row, latency_row

MIB32 = 32 << 20
P2P_GBS = {(0, 0): 17.0, (0, 1): 12.3, (1, 0): 12.7, (1, 1): 16.6}
GEMM_TFLOPS = 0.0225
LAT_US = 0.25
MEMCPY_GBS = 13.5


def write_host(root: Path, host: str, rng: np.random.Generator, *, degraded: bool = False,
               noisy_host_side: bool = False, label: str | None = None) -> None:
    """transfer + gemm results of ``host`` under root/<stage>/<label or host>/main.h5."""
    shift = rng.normal(0, 0.03)
    slow = rng.uniform(3, 8) if degraded else 1.0
    side = rng.uniform(2, 3.5) if noisy_host_side else 1.0

    def gbs_samples(gbs: float, rel: float = 0.03) -> list[float]:
        rate = gbs * np.exp(shift + rel * rng.standard_normal(5)) / slow
        return list(MIB32 / (rate * 1e9))

    rows = []
    for (s, d), gbs in P2P_GBS.items():
        rows.append(bandwidth_row(gbs_samples(gbs), MIB32, test="uni", metric="bandwidth", src=s,
                                  dst=d, mechanism="memcpy", p2p="host", bytes=MIB32))
        lat = LAT_US * side * slow * np.exp(0.15 * rng.standard_normal(5))
        rows.append(latency_row(list(lat * 100 / 1e6), 100, test="latency", metric="latency_cpu",
                                src=s, dst=d, mechanism="memcpy", p2p="host", bytes=16))
    memcpy = [bandwidth_row(gbs_samples(MEMCPY_GBS / side, 0.1), MIB32, bytes=MIB32, threads=1)]
    t = results.Result("transfer", "main", {}, "cpu", attrs={"device_names": ["cpu-virtual-0",
                                                                              "cpu-virtual-1"]})
    t.add_table("p2p", pd.DataFrame(rows))
    t.add_table("host_memcpy", pd.DataFrame(memcpy))
    flop = 2.0 * 768 ** 3
    tfl = GEMM_TFLOPS * np.exp(shift + 0.03 * rng.standard_normal(5)) / slow
    g = results.Result("gemm", "main", {}, "cpu")
    g.add_table("single", pd.DataFrame([{"M": 768, "N": 768, "K": 768, "dtype": "fp32",
                                         "time_s_samples": json.dumps(list(flop / (tfl * 1e12)))}]))
    old = os.environ.get("GPULAB_HOST")
    os.environ["GPULAB_HOST"] = host
    try:
        results.write(t, root / "transfer" / (label or host) / "main.h5")
        results.write(g, root / "gemm" / (label or host) / "main.h5")
    finally:
        if old is None:
            os.environ.pop("GPULAB_HOST", None)
        else:
            os.environ["GPULAB_HOST"] = old


def write_fleet(root: Path, seed: int, hosts: int = 6) -> tuple[str, str]:
    """A fleet of ``hosts`` labelled hosts: one degraded, another a noisy neighbour on host-side
    figures. Returns (degraded host, noisy host)."""
    rng = np.random.default_rng(seed)
    names = [f"h{i}" for i in range(1, hosts + 1)]
    sick, noisy = rng.choice(names, 2, replace=False)
    for h in names:
        write_host(root, h, rng, degraded=h == sick, noisy_host_side=h == noisy)
    return str(sick), str(noisy)
