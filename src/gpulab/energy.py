"""Energy per operation: an energy counter read around a timed region of at least one second.

GPU: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver
loaded; every data-center GPU since Volta). Its resolution is 1 mJ but it advances only every
20-100 ms, so a region shorter than :data:`MIN_SECONDS` cannot be resolved: :func:`measure` repeats
the work until the region lasts that long, and a row whose region stayed shorter (or whose counter
did not move) is marked ``resolved = False``. CPU: RAPL package energy (``/sys/class/powercap``,
µJ, wraps at ``max_energy_range_uj``) where it is readable; otherwise there is no meter and the row
is not_applicable with the reason (:func:`cpu_meter` / :func:`gpu_meter` return ``(None, reason)``).

Rows (:func:`row`): duration, energy (J), average power (W), throughput (work per second),
efficiency (work per J: GB/J, GFLOP/J, samples/J) and its inverse per unit of work (J/GB ...).
"""
from __future__ import annotations

import contextlib
import glob
import os
import time
from dataclasses import dataclass
from typing import Callable

MIN_SECONDS = 1.0
ALIGN_S = 0.25  # longest wait for the counter's next update (NVML: every 20-100 ms)
POWERCAP = "/sys/class/powercap"
COLUMNS = ["operation", "device", "meter", "work", "work_unit", "iterations", "duration_s",
           "energy_J", "avg_W", "throughput", "throughput_unit", "efficiency", "efficiency_unit",
           "per_op", "per_op_unit", "resolved", "note"]


class NvmlMeter:
    """Total energy of one GPU, in J, from NVML (the handle found by PCI bus id, so that the GPU is
    the one CUDA calls it, whatever CUDA_VISIBLE_DEVICES says)."""

    name = "nvml"

    def __init__(self, nvml, handle):
        self.nv, self.h = nvml, handle

    def read(self) -> float:
        return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) / 1e3


class RaplMeter:
    """Sum of the RAPL package domains' energy, in J, with counter wrap-around handled."""

    name = "rapl"

    def __init__(self, domains: list[str]):
        self.domains = domains
        self.max = [int(open(os.path.join(d, "max_energy_range_uj")).read()) for d in domains]
        self.last = [self._uj(d) for d in domains]
        self.total = 0.0

    @staticmethod
    def _uj(d: str) -> int:
        with open(os.path.join(d, "energy_uj")) as f:
            return int(f.read())

    def read(self) -> float:
        for i, d in enumerate(self.domains):
            now = self._uj(d)
            delta = now - self.last[i]
            if delta < 0:  # the counter wrapped
                delta += self.max[i]
            self.total += delta
            self.last[i] = now
        return self.total / 1e6


def gpu_meter(bus_id: str, nvml=None):
    """(NvmlMeter, '') for the GPU at ``bus_id``, or (None, reason) where NVML or the counter is
    missing."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no library: the reason is the answer
        return None, f"NVML not available: {exc}"
    try:
        h = nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode() if isinstance(bus_id, str) else bus_id)
        nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported on pre-Volta/consumer parts
        return None, f"NVML total-energy counter not supported for GPU {bus_id}: {exc}"
    return NvmlMeter(nvml, h), ""


def cpu_meter(root: str = POWERCAP):
    """(RaplMeter, '') over the readable RAPL package domains, or (None, reason)."""
    domains = []
    for d in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
        if os.path.basename(d).count(":") != 1:
            continue  # sub-domains (core, uncore, dram) are inside the package's count
        with contextlib.suppress(OSError, ValueError):
            RaplMeter._uj(d)
            domains.append(d)
    if not domains:
        why = ("no RAPL domains under " + root if not glob.glob(os.path.join(root, "intel-rapl:*"))
               else f"RAPL energy_uj under {root} is not readable (root only since Linux 5.10)")
        return None, why
    try:
        return RaplMeter(domains), ""
    except (OSError, ValueError) as exc:
        return None, f"RAPL max_energy_range_uj not readable: {exc}"


@dataclass
class Reading:
    iterations: int
    duration_s: float
    energy_J: float
    resolved: bool
    note: str = ""


def _next_tick(meter, limit_s: float = ALIGN_S) -> float | None:
    """Poll ``meter`` until its value changes (the counter's next update); the new value, or None
    when it did not change within ``limit_s`` (real time)."""
    v0 = meter.read()
    t_end = time.perf_counter() + limit_s
    while time.perf_counter() < t_end:
        v = meter.read()
        if v != v0:
            return v
    return None


def measure(fn: Callable[[], None], meter, sync: Callable[[], None] = lambda: None,
            min_seconds: float = MIN_SECONDS, max_iterations: int = 1_000_000,
            clock: Callable[[], float] = time.perf_counter) -> Reading:
    """Run ``fn`` back to back for at least ``min_seconds`` (synchronized) inside two readings of
    ``meter``; one warm-up call first (not counted).

    Both ends sit on counter updates: the region starts right after an update and, once
    ``min_seconds`` have passed, the work goes on until the next update. The counter then holds
    exactly the energy of the timed region, instead of being up to one update period (NVML on an
    H200: 100 ms, i.e. 10 % of a 1 s region) off at each end.
    """
    fn()
    sync()
    e0 = _next_tick(meter)
    aligned = e0 is not None
    e0 = meter.read() if e0 is None else e0
    t0 = clock()
    n = 0
    while True:
        fn()
        n += 1
        if n >= max_iterations or (n & (n - 1) == 0 or n % 64 == 0):
            sync()  # a GPU queue must be drained before the clock can say the work is done
            if clock() - t0 >= min_seconds or n >= max_iterations:
                break
    sync()
    e1 = meter.read()
    if aligned and n < max_iterations:
        t_stop = clock() + ALIGN_S
        while clock() < t_stop:  # keep working until the counter updates
            fn()
            n += 1
            sync()
            v = meter.read()
            if v != e1:
                e1 = v
                break
    t1 = clock()
    secs, joules = t1 - t0, e1 - e0
    resolved = secs >= min_seconds and joules > 0
    note = "" if resolved else (
        f"region {secs:.3f} s < {min_seconds:g} s: the counter cannot resolve it"
        if secs < min_seconds else "the energy counter did not advance")
    if resolved and not aligned:
        note = "counter updates not aligned (it did not change within 0.25 s): +-1 update period"
    return Reading(n, secs, joules, resolved, note)


PER = {"GB": ("GB/s", "GB/J", "J/GB"), "GFLOP": ("GFLOP/s", "GFLOP/J", "J/GFLOP"),
       "sample": ("samples/s", "samples/J", "J/sample")}


def row(operation: str, device: str, meter_name: str, work_per_iteration: float, work_unit: str,
        r: Reading) -> dict:
    """One energy row: ``work_per_iteration`` in ``work_unit`` (GB, GFLOP or sample)."""
    tu, eu, pu = PER[work_unit]
    work = work_per_iteration * r.iterations
    j = r.energy_J if r.resolved else float("nan")
    return {"operation": operation, "device": device, "meter": meter_name, "work": work,
            "work_unit": work_unit, "iterations": r.iterations, "duration_s": r.duration_s,
            "energy_J": j, "avg_W": j / r.duration_s if r.duration_s > 0 else float("nan"),
            "throughput": work / r.duration_s if r.duration_s > 0 else float("nan"),
            "throughput_unit": tu, "efficiency": work / j if j and j == j else float("nan"),
            "efficiency_unit": eu, "per_op": j / work if work else float("nan"), "per_op_unit": pu,
            "resolved": r.resolved, "note": r.note}


def not_applicable_row(operation: str, device: str, reason: str, work_unit: str) -> dict:
    tu, eu, pu = PER[work_unit]
    nan = float("nan")
    return {"operation": operation, "device": device, "meter": "none", "work": nan,
            "work_unit": work_unit, "iterations": 0, "duration_s": nan, "energy_J": nan,
            "avg_W": nan, "throughput": nan, "throughput_unit": tu, "efficiency": nan,
            "efficiency_unit": eu, "per_op": nan, "per_op_unit": pu, "resolved": False,
            "note": f"not_applicable: {reason}"}


def torch_meter(device):
    """(meter, reason) for a torch device: NVML for a CUDA device, RAPL for the CPU."""
    if device.type != "cuda":
        return cpu_meter()
    import torch

    p = torch.cuda.get_device_properties(device)
    return gpu_meter(f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0")


def torch_sync(device) -> Callable[[], None]:
    if device.type == "cuda":
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None
