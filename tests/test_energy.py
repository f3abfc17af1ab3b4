"""The energy meter (NVML faked at its boundary, RAPL from a fake sysfs) and its rows."""
from __future__ import annotations

import math

import pytest

from gpulab import energy


class FakeNvml:
    """pynvml's surface the meter uses: a counter in mJ that advances with a fake clock."""

    def __init__(self, watts=600.0, supported=True):
        self.watts, self.supported, self.t = watts, supported, 0.0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        assert bus == b"00000000:1B:00.0"
        return "h"

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.supported:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return int(self.t * self.watts * 1e3)


class Clock:
    def __init__(self, nv, step):
        self.nv, self.step = nv, step

    def work(self):  # each call of the timed work takes `step` seconds
        self.nv.t += self.step

    def __call__(self):
        return self.nv.t


def test_nvml_meter_resolves_a_region_of_at_least_a_second():
    nv = FakeNvml(watts=600.0)
    meter, why = energy.gpu_meter("00000000:1B:00.0", nv)
    assert why == "" and meter.name == "nvml"
    clk = Clock(nv, 0.01)
    r = energy.measure(clk.work, meter, clock=clk)
    assert r.resolved and r.duration_s >= 1.0 and r.iterations >= 100
    assert r.energy_J == pytest.approx(600.0 * r.duration_s, rel=1e-3)
    row = energy.row("GEMM bf16", "cuda:0", meter.name, 1099.5, "GFLOP", r)
    assert row["avg_W"] == pytest.approx(600.0, rel=1e-3)
    assert row["efficiency"] == pytest.approx(1099.5 * r.iterations / r.energy_J)
    assert row["per_op"] == pytest.approx(1 / row["efficiency"])
    assert (row["throughput_unit"], row["efficiency_unit"], row["per_op_unit"]) == (
        "GFLOP/s", "GFLOP/J", "J/GFLOP")


def test_a_region_shorter_than_a_second_is_unresolved():
    nv = FakeNvml()
    meter, _ = energy.gpu_meter("00000000:1B:00.0", nv)
    clk = Clock(nv, 0.01)
    r = energy.measure(clk.work, meter, clock=clk, max_iterations=10)
    assert not r.resolved and "cannot resolve" in r.note
    row = energy.row("copy", "cuda:0", "nvml", 2.0, "GB", r)
    assert math.isnan(row["energy_J"]) and math.isnan(row["per_op"]) and not row["resolved"]


def test_a_counter_that_does_not_move_is_unresolved():
    nv = FakeNvml(watts=0.0)
    meter, _ = energy.gpu_meter("00000000:1B:00.0", nv)
    clk = Clock(nv, 0.05)
    r = energy.measure(clk.work, meter, clock=clk)
    assert not r.resolved and "did not advance" in r.note


def test_unsupported_counter_gives_the_reason():
    meter, why = energy.gpu_meter("00000000:1B:00.0", FakeNvml(supported=False))
    assert meter is None and "not supported" in why and "1B:00.0" in why


def _rapl(root, uj, max_uj=1000_000_000, readable=True):
    d = root / "intel-rapl:0"
    d.mkdir(parents=True, exist_ok=True)
    (d / "energy_uj").write_text(str(uj))
    (d / "max_energy_range_uj").write_text(str(max_uj))
    sub = root / "intel-rapl:0:0"  # a sub-domain: inside the package's count, not added
    sub.mkdir(exist_ok=True)
    (sub / "energy_uj").write_text("5")
    if not readable:
        (d / "energy_uj").chmod(0)
    return d


def test_rapl_reads_packages_and_handles_wraparound(tmp_path):
    d = _rapl(tmp_path, 999_000_000)
    meter, why = energy.cpu_meter(str(tmp_path))
    assert why == "" and meter.domains == [str(d)]
    assert meter.read() == 0.0
    (d / "energy_uj").write_text("1_000_000".replace("_", ""))  # wrapped past 1e9
    assert meter.read() == pytest.approx((1e9 - 999e6 + 1e6) / 1e6)


def test_rapl_missing_or_unreadable_is_not_applicable_with_reason(tmp_path):
    meter, why = energy.cpu_meter(str(tmp_path / "none"))
    assert meter is None and why.startswith("no RAPL domains under")
    import os

    if os.geteuid() != 0:  # root reads a mode-0 file anyway
        _rapl(tmp_path, 10, readable=False)
        meter, why = energy.cpu_meter(str(tmp_path))
        assert meter is None and "not readable" in why
    row = energy.not_applicable_row("copy", "cpu", why, "GB")
    assert row["note"].startswith("not_applicable: ") and not row["resolved"]


class WallMeter:
    """A meter of 100 W on the real clock (the wiring tests run real torch work)."""

    name = "fake"

    def __init__(self):
        import time

        self.t0 = time.perf_counter()

    def read(self):
        import time

        return (time.perf_counter() - self.t0) * 100.0


@pytest.mark.slow
def test_gemm_and_copy_rows_wire_the_meter(monkeypatch):
    import torch

    from gpulab.gemm import energy as gemm_energy
    from gpulab.gemm import numerics
    from gpulab.transfer import energy as transfer_energy

    monkeypatch.setattr(energy, "torch_meter", lambda device: (WallMeter(), ""))
    precs = [numerics.precision("bf16")]
    (g,) = gemm_energy.bf16_rows(torch.device("cpu"), 64, 0, precs)
    assert g["resolved"] and g["duration_s"] >= 1.0 and g["avg_W"] == pytest.approx(100, rel=0.05)
    assert g["efficiency_unit"] == "GFLOP/J" and g["efficiency"] > 0
    (c,) = transfer_energy.same_device_copy_rows(None, 1 << 16)
    assert c["resolved"] and c["per_op_unit"] == "J/GB" and c["work"] == pytest.approx(
        c["iterations"] * 2 * (1 << 16) / 1e9)
    monkeypatch.setattr(energy, "torch_meter", lambda device: (None, "no RAPL domains under x"))
    (na,) = gemm_energy.bf16_rows(torch.device("cpu"), 64, 0, precs)
    assert na["note"] == "not_applicable: no RAPL domains under x"
    (na2,) = gemm_energy.bf16_rows(torch.device("cpu"), 64, 0, [numerics.precision("fp32")])
    assert "bf16 not supported" in na2["note"]


class TickingNvml(FakeNvml):
    """A counter that advances only every 100 ms (as NVML's on an H200), polled at 1 ms a read."""

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.t += 0.001
        return int(int(self.t / 0.1) * 0.1 * self.watts * 1e3)


def test_region_ends_sit_on_counter_updates():
    nv = TickingNvml(watts=600.0)
    meter, _ = energy.gpu_meter("00000000:1B:00.0", nv)
    nv.t = 0.06  # start mid-period (unaligned, this case reads 4 % high)
    clk = Clock(nv, 0.03)
    r = energy.measure(clk.work, meter, clock=clk)
    assert r.resolved and r.note == ""
    # energy of the timed region itself, not off by up to one 100 ms update at each end
    assert r.energy_J == pytest.approx(600.0 * r.duration_s, rel=0.01)


def _digits_and_cfg(models=("cnn", "mlp")):
    """scikit-learn's real digits (8x8, as the train stage's training set) and a small config."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    from conftest import stage_settings

    d = load_digits()
    x = torch.from_numpy((d.images[:256] / 16.0).astype(np.float32)[:, None])
    ds = torch.utils.data.TensorDataset(x, torch.from_numpy(d.target[:256]))
    cfg = stage_settings("train", models=list(models), mlp_hidden=[32], batch_sizes=[8, 16])
    return ds, cfg


def _fake_clock_meter(monkeypatch, watts):
    """A 'watts' NVML counter on a fake clock: every training step the meter sees takes 0.3 s (a
    few real steps fill the 1 s region). Returns the steps run inside energy.measure (warm-up
    included)."""
    nv = FakeNvml(watts=watts)
    meter, _ = energy.gpu_meter("00000000:1B:00.0", nv)
    clk = Clock(nv, 0.3)
    calls = []
    real = energy.measure

    def measure(fn, m, sync):
        def step():
            fn()
            calls.append(1)
            clk.work()
        return real(step, m, sync, clock=clk)

    monkeypatch.setattr(energy, "torch_meter", lambda device: (meter, ""))
    monkeypatch.setattr(energy, "measure", measure)
    return calls


@pytest.mark.slow  # real training steps for the >= 1 s region the meter needs
def test_training_energy_is_joules_per_sample_of_the_steps_run(monkeypatch):
    import torch

    from gpulab.train import energy as train_energy

    ds, cfg = _digits_and_cfg(models=("mlp",))
    calls = _fake_clock_meter(monkeypatch, watts=50.0)
    (r,) = train_energy.step_rows(cfg, ds, torch.device("cpu"))
    batch = 16  # the sweep's largest
    assert r["operation"] == "training step mlp, batch 16 (data, forward, backward, SGD step)"
    assert r["resolved"] and r["meter"] == "nvml" and r["duration_s"] >= 1.0
    assert r["iterations"] == len(calls) - 1  # the warm-up step is not counted
    assert r["work"] == r["iterations"] * batch and r["work_unit"] == "sample"
    assert r["energy_J"] == pytest.approx(50.0 * r["duration_s"], rel=1e-3)
    assert r["per_op"] == pytest.approx(r["energy_J"] / (r["iterations"] * batch))
    assert r["efficiency"] == pytest.approx(1 / r["per_op"]) and r["avg_W"] == pytest.approx(50.0,
                                                                                          rel=1e-3)
    assert (r["throughput_unit"], r["efficiency_unit"], r["per_op_unit"]) == (
        "samples/s", "samples/J", "J/sample")


def test_training_energy_rows_without_a_meter_say_why(monkeypatch):
    import torch

    from gpulab.train import energy as train_energy

    ds, cfg = _digits_and_cfg()
    monkeypatch.setattr(energy, "torch_meter", lambda device: (None, "no RAPL domains under x"))
    rows = train_energy.step_rows(cfg, ds, torch.device("cpu"))
    assert [r["operation"].split(",")[0] for r in rows] == ["training step cnn", "training step mlp"]
    for r in rows:
        assert r["note"] == "not_applicable: no RAPL domains under x" and not r["resolved"]
        assert r["iterations"] == 0 and math.isnan(r["per_op"]) and r["per_op_unit"] == "J/sample"


def test_a_training_step_with_a_non_finite_loss_is_unresolved(monkeypatch):
    import torch

    from gpulab.train import energy as train_energy
    from gpulab.train import loop

    ds, cfg = _digits_and_cfg(models=("mlp",))
    _fake_clock_meter(monkeypatch, watts=50.0)
    monkeypatch.setattr(loop, "timed_step", lambda *a, **k: ({}, float("nan")))
    (r,) = train_energy.step_rows(cfg, ds, torch.device("cpu"))
    assert not r["resolved"] and "non-finite loss" in r["note"] and math.isnan(r["per_op"])
