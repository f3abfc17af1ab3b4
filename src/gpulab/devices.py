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

# CUDA's default order is "fastest first", which need not match nvidia-smi's and NVML's PCI order:
# ids handed out by the slot pool and recorded in results must mean the same GPU to every tool.
# Set, not defaulted: an inherited FASTEST_FIRST would make "GPU 1" a different GPU here.
os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


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


# Device nodes of the drivers torch's CUDA backend runs on (NVIDIA; WSL's GPU bridge; ROCm, which
# torch also calls cuda). Where none exists no GPU can be visible, and a stage process that only
# launches its ranks (collectives, DDP, pipeline, tensor parallel) need not import torch (~1.5
# CPU-seconds on the 2-core CI machine) to learn it.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


def cuda_available() -> bool:
    if not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
        return False
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


def link_info(bus_ids: list[str]) -> list[dict]:
    """PCIe link and NVLink peers of each GPU (given by PCI bus id), as NVML reports them now.

    Per GPU: ``pcie_gen_now``/``pcie_width_now`` (what the link runs at right now: read it under
    load, an idle link trains down to save power), ``pcie_gen_max``/``pcie_width_max`` (the most
    this device in this slot can train to), ``nvlinks`` (active links), ``nvlinks_to`` {peer
    position: direct links} and ``nvlinks_switch`` (active links to an NVSwitch, which reach every
    GPU on the switch). Keys are missing where NVML does not answer; without NVML every dict is
    empty.
    """
    out: list[dict] = [{} for _ in bus_ids]
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:
        return out
    norm = [_bus(b) for b in bus_ids]
    try:
        for k, bus in enumerate(bus_ids):
            try:
                h = nv.nvmlDeviceGetHandleByPciBusId(bus.encode() if isinstance(bus, str) else bus)
            except Exception:
                continue
            d = out[k]
            for key, fn in (("pcie_gen_now", nv.nvmlDeviceGetCurrPcieLinkGeneration),
                            ("pcie_width_now", nv.nvmlDeviceGetCurrPcieLinkWidth),
                            ("pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration),
                            ("pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth)):
                try:
                    d[key] = int(fn(h))
                except Exception:
                    pass
            remotes = []
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    remote = _bus(nv.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link).busId)
                except Exception:
                    continue
                remotes.append((remote, _remote_type(nv, h, link)))
            d.update(count_nvlinks(remotes, norm))
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return out


def _bus(b) -> str:
    """PCI bus id in one spelling ('00000000:1B:00.0' and '0000:1b:00.0' are the same device)."""
    s = b.decode() if isinstance(b, bytes) else str(b)
    dom, _, rest = s.strip().lower().partition(":")
    return f"{int(dom, 16):04x}:{rest}" if rest else s.lower()


NVLINK_SWITCH = "switch"


def _remote_type(nv, handle, link: int) -> str:
    """'switch', 'gpu' or 'unknown': what the far end of an NVLink is, as NVML says."""
    try:
        t = nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
    except Exception:  # older NVML: the type is not known
        return "unknown"
    if t == getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
        return NVLINK_SWITCH
    return "gpu" if t == getattr(nv, "NVML_NVLINK_DEVICE_TYPE_GPU", 0) else "unknown"


def count_nvlinks(remotes: list[tuple[str, str]], visible: list[str]) -> dict:
    """Active NVLinks of one GPU from its links' (remote bus id, remote device type).

    A link to a visible GPU counts for that GPU; a link counts as a switch link only when NVML
    says its far end is an NVSwitch. A link to a GPU that is not visible (a 4-GPU direct mesh with
    2 GPUs given to this job) counts in ``nvlinks`` but reaches no visible peer (issue 24: it used
    to count as a switch link, so the pair's share read 1.0 instead of 1/3).
    """
    to, switch, unknown = {}, 0, 0
    for remote, kind in remotes:
        if remote in visible:
            j = visible.index(remote)
            to[j] = to.get(j, 0) + 1
        elif kind == NVLINK_SWITCH:
            switch += 1
        elif kind != "gpu":  # NVML could not say (older driver): neither a peer nor a switch
            unknown += 1
    return {"nvlinks": len(remotes), "nvlinks_to": to, "nvlinks_switch": switch,
            "nvlinks_unknown": unknown}


def nvlink_share(links: list[dict], i: int, j: int) -> float | None:
    """Share of GPU i's NVLink bandwidth that reaches GPU j: 0 if no NVLink path, None if unknown.

    Direct links count for the pair; links to an NVSwitch count when both GPUs hang on switches
    (every switch link carries traffic to any peer). The datasheet NVLink figure is per GPU, all
    links together, so the pair's limit is that figure times this share.
    """
    a, b = links[i], links[j]
    if "nvlinks" not in a or "nvlinks" not in b:
        return None
    if a.get("nvlinks_unknown") or b.get("nvlinks_unknown"):
        return None  # a link whose far end NVML cannot name: the share is not known
    if not a["nvlinks"]:
        return 0.0
    via = a["nvlinks_to"].get(j, 0) + (a["nvlinks_switch"] if b["nvlinks_switch"] else 0)
    return via / a["nvlinks"]


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
