"""Datasheet limits of GPU models (``limits.yaml``) and PCIe link limits from generation x width.

Every bandwidth and TFLOP/s headline is reported also as a fraction of its limit. An unknown model
or a missing figure gives None with the reason; gpulab never guesses a limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml


@dataclass(frozen=True)
class Limit:
    """A physical limit, or None with why there is none."""

    value: float | None
    unit: str
    source: str
    reason: str = ""

    @property
    def known(self) -> bool:
        return self.value is not None and self.value > 0


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    with resources.files("gpulab").joinpath("limits.yaml").open() as fh:
        return yaml.safe_load(fh)


def _norm(name: str) -> str:
    return " ".join(str(name).split()).casefold()


def model_of(device_name: str | None) -> dict[str, Any] | None:
    """The datasheet entry that lists the driver's whole device name (case and runs of spaces
    aside); never a substring match: "NVIDIA GH200 480GB" is not an "NVIDIA H200"."""
    if not device_name:
        return None
    name = _norm(device_name)
    for m in table()["models"]:
        if name in {_norm(n) for n in m["names"]}:
            return m
    return None


def _unknown(device_name: str | None, unit: str, what: str) -> Limit:
    known = ", ".join(m["model"] for m in table()["models"])
    return Limit(None, unit, "", f"no datasheet {what} for {device_name or 'a CPU device'!r} "
                                 f"(gpulab/limits.yaml knows: {known})")


def memory_bandwidth(device_name: str | None) -> Limit:
    m = model_of(device_name)
    if m is None or not m.get("memory_gbps"):
        return _unknown(device_name, "GB/s", "memory bandwidth")
    return Limit(float(m["memory_gbps"]), "GB/s", f"{m['model']}: {m['source']}")


def peak_tflops(device_name: str | None, dtype: str) -> Limit:
    m = model_of(device_name)
    if m is None:
        return _unknown(device_name, "TFLOP/s", f"{dtype} peak")
    v = (m.get("tflops") or {}).get(dtype)
    if not v:
        return Limit(None, "TFLOP/s", "", f"{m['model']}: no datasheet {dtype} peak")
    return Limit(float(v), "TFLOP/s", f"{m['model']} dense {dtype}: {m['source']}")


def nvlink_bandwidth(device_name: str | None) -> Limit:
    m = model_of(device_name)
    if m is None:
        return _unknown(device_name, "GB/s", "NVLink bandwidth")
    v = m.get("nvlink_gbps_per_direction")
    if not v:
        return Limit(None, "GB/s", "", f"{m['model']} has no NVLink")
    return Limit(float(v), "GB/s", f"{m['model']} NVLink per direction: {m['source']}")


def pcie_bandwidth(gen: int | str | None, width: int | str | None) -> Limit:
    """Per-direction PCIe limit of a link as the probe reads it (current generation and width)."""
    pcie = table()["pcie_gbps_per_lane"]
    try:
        g, w = int(gen), int(width)
    except (TypeError, ValueError):
        return Limit(None, "GB/s", "", f"PCIe generation/width not known (gen={gen!r}, width={width!r})")
    per_lane = pcie["gen"].get(g)
    if per_lane is None or w <= 0:
        return Limit(None, "GB/s", "", f"no PCIe figure for Gen{g} x{w}")
    return Limit(per_lane * w, "GB/s", f"PCIe Gen{g} x{w}: {pcie['source']}")
