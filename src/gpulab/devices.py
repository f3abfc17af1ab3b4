"""Device discovery: CUDA GPUs when present, else CPU "virtual devices".

Every stage asks this module for its devices, so a result always says which kind of device produced
it. Counting GPUs must not initialise CUDA in the Snakemake main process (a forked job would then
inherit a CUDA context), so :func:`physical_gpu_count` asks NVML / ``nvidia-smi`` first.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Literal

Kind = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class Device:
    """One compute device a stage can place work on."""

    kind: Kind
    index: int  # ordinal inside this process (cuda:<index> or virtual cpu <index>)
    name: str
    memory_bytes: int
    physical_id: str  # the id the host knows it by (slot id / CUDA_VISIBLE_DEVICES entry)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}"

    @property
    def torch_device(self):
        import torch

        # Virtual CPU devices all map onto the one torch CPU device; they differ in the process or
        # thread that owns them, not in the torch device.
        return torch.device(f"cuda:{self.index}") if self.kind == "cuda" else torch.device("cpu")

    def as_dict(self) -> dict:
        return asdict(self)


def physical_gpu_count() -> int:
    """Number of NVIDIA GPUs on the host, ignoring CUDA_VISIBLE_DEVICES, without touching CUDA."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
            ).stdout
            return sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (subprocess.SubprocessError, OSError):
            pass
    return 0


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def _visible_ids(count: int) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if len(ids) >= count:
            return ids[:count]
    return [str(i) for i in range(count)]


def cuda_devices() -> list[Device]:
    import torch

    n = torch.cuda.device_count()
    ids = _visible_ids(n)
    devices = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        devices.append(Device("cuda", i, p.name, int(p.total_memory), ids[i]))
    return devices


def cpu_devices(count: int) -> list[Device]:
    import psutil

    if count < 1:
        raise ValueError(f"cpu_devices must be >= 1, got {count}")
    mem = psutil.virtual_memory().total // count
    return [Device("cpu", i, f"cpu-virtual-{i}", int(mem), f"cpu{i}") for i in range(count)]


def discover(backend: str = "auto", cpu_count: int = 2, limit: int | None = None) -> list[Device]:
    """Devices for a stage.

    backend: ``auto`` (CUDA if any GPU is visible, else CPU virtual devices), ``cuda`` (error if
    none) or ``cpu``. ``limit`` caps the number of devices returned.
    """
    if backend not in ("auto", "cuda", "cpu"):
        raise ValueError(f"backend must be auto, cuda or cpu, got {backend!r}")
    if backend in ("auto", "cuda") and cuda_available():
        devices = cuda_devices()
    elif backend == "cuda":
        raise RuntimeError(
            "backend 'cuda' was requested but no CUDA GPU is visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    else:
        devices = cpu_devices(cpu_count)
    if limit is not None:
        if limit > len(devices):
            raise RuntimeError(f"{limit} devices requested but only {len(devices)} available")
        devices = devices[:limit]
    return devices


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="List the devices gpulab would use on this host.")
    ap.add_argument("--backend", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--cpu-devices", type=int, default=2, help="virtual CPU devices without GPUs")
    ap.add_argument("--count", action="store_true", help="print only the physical GPU count")
    args = ap.parse_args(argv)
    if args.count:
        print(physical_gpu_count())
        return 0
    print(json.dumps([d.as_dict() for d in discover(args.backend, args.cpu_devices)], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
