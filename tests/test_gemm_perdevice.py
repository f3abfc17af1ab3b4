"""Issue 25: the GEMM health figure, every GPU of the node at steady clocks (gpulab.gemm.perdevice).

The CUDA path is faked at the torch boundary (no GPU here): every GPU is measured under its own
``torch.cuda.device`` context; the warm-up logic with scripted timings and clock readings; the CPU
path for real.
"""
from __future__ import annotations

import contextlib
import json

import pytest
import torch

from gpulab.gemm import numerics, perdevice


def test_every_gpu_is_measured_under_its_own_device_context(monkeypatch):
    current = []
    seen = []

    @contextlib.contextmanager
    def fake_device(d):
        current.append(d)
        yield
        current.pop()

    monkeypatch.setattr(torch.cuda, "device", fake_device)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(perdevice, "on_device", lambda idx, dev, *a: seen.append((idx, dev, list(current)))
                        or [{"gpu": idx}])
    devs = [torch.device("cuda", i) for i in range(4)]
    rows = perdevice.measure(devs, 8192, [numerics.precision("bf16")], 1.0, 5, 10.0, 0)
    assert [r["gpu"] for r in rows] == [0, 1, 2, 3]
    assert seen == [(i, devs[i], [devs[i]]) for i in range(4)]


def _scripted(monkeypatch, rates, clocks):
    """_batch_s answers from `rates` (seconds per call, one per chunk), _clock_mhz from `clocks`."""
    it_r, it_c = iter(rates), iter(clocks)
    last = {"r": None, "c": None}

    def batch(fn, n, device):
        last["r"] = next(it_r, last["r"])
        return last["r"] * n

    def clock(device):
        last["c"] = next(it_c, last["c"])
        return last["c"]

    monkeypatch.setattr(perdevice, "_batch_s", batch)
    monkeypatch.setattr(perdevice, "_clock_mhz", clock)


def test_warm_up_waits_for_the_rate_and_the_clock_to_settle(monkeypatch):
    # two first single calls, then chunks: the rate settles at chunk 4, the clock only at chunk 6
    _scripted(monkeypatch, [5e-3, 2e-3, 2.0e-3, 1.8e-3, 1.7e-3, 1.7e-3, 1.7e-3, 1.7e-3, 1.7e-3],
              [1980, 1900, 1830, 1800, 1785, 1785])
    calls = []
    t_call, stable, _, clock = perdevice.warm_up(lambda: calls.append(1), torch.device("cuda", 0), 60)
    assert stable and t_call == pytest.approx(1.7e-3) and clock == 1785


def test_warm_up_that_never_settles_says_so(monkeypatch):
    import itertools

    _scripted(monkeypatch, itertools.cycle([1e-3, 1.1e-3]), itertools.repeat(1980.0))
    _, stable, spent, _ = perdevice.warm_up(lambda: None, torch.device("cpu"), 0.05)
    assert not stable and spent >= 0.05


def test_samples_last_the_asked_seconds(monkeypatch):
    _scripted(monkeypatch, [2e-3] * 100, [1830.0] * 100)
    (r,) = perdevice.on_device(0, torch.device("cpu"), 64, [numerics.precision("bf16")], 1.0, 5, 10.0, 0)
    assert r["calls_per_sample"] == 500 and r["sample_s"] == pytest.approx(1.0)
    assert r["warmup_stable"] and json.loads(r["time_s_samples"]) == [2e-3] * 5
    assert r["tflops_median"] == pytest.approx(2 * 64**3 / 2e-3 / 1e12)


@pytest.mark.slow  # a real measurement: ~1 s of timed GEMMs
def test_cpu_measurement_for_real():
    (r,) = perdevice.measure([torch.device("cpu")], 128, [numerics.precision("fp32")], 0.05, 3, 1.0, 0)
    assert r["gpu"] == 0 and r["dtype"] == "fp32" and r["calls_per_sample"] >= 1
    assert len(json.loads(r["time_s_samples"])) == 3 and r["tflops_median"] > 0


def test_per_gpu_rows_become_gating_metrics_and_single_rows_inform(tmp_path):
    import os

    import pandas as pd

    from gpulab import metrics as metmod
    from gpulab import results

    g = results.Result("gemm", "main", {}, "cuda", attrs={"device_name": "NVIDIA H200"})
    g.add_table("single", pd.DataFrame([{"M": 2048, "N": 2048, "K": 2048, "dtype": "bf16",
                                         "time_s_samples": json.dumps([5e-5, 4e-5])}]))
    g.add_table("per_gpu", pd.DataFrame([{"gpu": i, "M": 8192, "N": 8192, "K": 8192, "dtype": "bf16",
                                          "time_s_samples": json.dumps([1.67e-3, 1.66e-3])}
                                         for i in range(2)]))
    os.environ["GPULAB_HOST"] = "h"
    try:
        results.write(g, tmp_path / "gemm" / "h" / "main.h5")
    finally:
        del os.environ["GPULAB_HOST"]
    s = metmod.find(tmp_path)
    cls = dict(zip(s["metric"], s["cls"]))
    assert cls["gemm/per_gpu/gpu=0/bf16/8192x8192x8192"] == metmod.GATING
    assert cls["gemm/per_gpu/gpu=1/bf16/8192x8192x8192"] == metmod.GATING
    assert cls["gemm/single/bf16/2048x2048x2048"] == metmod.INFORMATIONAL
    v = s[s["metric"] == "gemm/per_gpu/gpu=0/bf16/8192x8192x8192"]["value"]
    assert v.iloc[0] == pytest.approx(2 * 8192**3 / 1.67e-3 / 1e12)
