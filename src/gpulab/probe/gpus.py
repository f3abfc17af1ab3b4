"""The GPU side: per-GPU properties, the peer-access matrix and NVLink state.

torch gives the CUDA runtime's view (compute capability, SMs, memory); NVML adds clocks, PCI bus id,
NUMA node and NVLink state. Where NVML is missing, NVLink state comes from parsed ``nvidia-smi``.
"""
from __future__ import annotations

import contextlib

from gpulab.probe import nodestate, nvsmi


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


@contextlib.contextmanager
def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _nvml_handle_for_bus(nv, bus_id: str):
    with contextlib.suppress(Exception):
        return nv.nvmlDeviceGetHandleByPciBusId(bus_id.encode() if isinstance(bus_id, str) else bus_id)
    return None


def _nvml_details(nv, h) -> dict:
    d: dict = {}
    calls = {
        "uuid": lambda: _s(nv.nvmlDeviceGetUUID(h)),
        "sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "mem_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        "sm_clock_now_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "mem_clock_now_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        "pcie_gen_max": lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie_width_max": lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h),
        "pcie_gen_now": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie_width_now": lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
        "numa_node": lambda: nv.nvmlDeviceGetNumaNodeId(h),
        "ecc_enabled": lambda: bool(nv.nvmlDeviceGetEccMode(h)[0]),
        "persistence_mode": lambda: bool(nv.nvmlDeviceGetPersistenceMode(h)),
        # What a sick node shows: clocks held down (bit mask of NVML clock event reasons), memory
        # errors since boot, a degraded PCIe link (gen/width above).
        "throttle_reasons": lambda: int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        "ecc_uncorrected_volatile": lambda: int(nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
        "ecc_corrected_volatile": lambda: int(nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)),
        "retired_pages_pending": lambda: bool(nv.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "temperature_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "power_draw_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
    }
    for k, fn in calls.items():
        with contextlib.suppress(Exception):
            d[k] = fn()
    return d


def _nvml_nvlinks(nv, h) -> dict[int, dict]:
    links: dict[int, dict] = {}
    caps = {
        "P2P is supported": "NVML_NVLINK_CAP_P2P_SUPPORTED",
        "Access to system memory supported": "NVML_NVLINK_CAP_SYSMEM_ACCESS",
        "P2P atomics supported": "NVML_NVLINK_CAP_P2P_ATOMICS",
        "System memory atomics supported": "NVML_NVLINK_CAP_SYSMEM_ATOMICS",
        "SLI is supported": "NVML_NVLINK_CAP_SLI_BRIDGE",
        "Link is supported": "NVML_NVLINK_CAP_VALID",
    }
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            active = nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED
        except Exception:
            continue
        entry: dict = {"active": bool(active)}
        with contextlib.suppress(Exception):
            entry["version"] = nv.nvmlDeviceGetNvLinkVersion(h, link)
        with contextlib.suppress(Exception):
            entry["remote_bus_id"] = _s(nv.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link).busId)
        for name, const in caps.items():
            with contextlib.suppress(Exception):
                entry[name] = bool(nv.nvmlDeviceGetNvLinkCapability(h, link, getattr(nv, const)))
        links[link] = entry
    return links


def gpu_info() -> list[dict]:
    """One dict per visible CUDA device (empty list without GPUs)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    # Node state first, before this process touches a GPU: then no context of the probe's own is
    # on the GPUs (in a container NVML lists host PIDs, which could not be told from a tenant's).
    state = node_state_by_bus(_own_pids())
    gpus = []
    with _nvml() as nv:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            g = {
                "index": i,
                "name": p.name,
                "compute_capability": f"{p.major}.{p.minor}",
                "sm_count": p.multi_processor_count,
                "memory_bytes": int(p.total_memory),
                "l2_cache_bytes": int(getattr(p, "L2_cache_size", 0)),
                "pci_bus_id": _pci_bus_id(i),
            }
            if nv is not None and g["pci_bus_id"]:
                h = _nvml_handle_for_bus(nv, g["pci_bus_id"])
                if h is not None:
                    g.update(_nvml_details(nv, h))
                    g["nvlinks_nvml"] = _nvml_nvlinks(nv, h)
            g.update(state.get(_bus_key(g["pci_bus_id"]), {}))
            g.setdefault("numa_node", _sysfs_numa(g["pci_bus_id"]))
            gpus.append(g)
    return gpus


def _bus_key(bus_id) -> str:
    """PCI bus ids as NVML ("00000000:19:00.0") and the CUDA runtime ("0000:19:00.0") spell them."""
    return _s(bus_id).lower()[-12:]


def node_state_by_bus(own: set[int]) -> dict[str, dict]:
    """{PCI bus id: node-state fields} of every GPU NVML sees (gpulab.probe.nodestate)."""
    out = {}
    with _nvml() as nv:
        if nv is None:
            return out
        with contextlib.suppress(Exception):
            for i in range(nv.nvmlDeviceGetCount()):
                with contextlib.suppress(Exception):
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    out[_bus_key(nv.nvmlDeviceGetPciInfo(h).busId)] = nodestate.gpu_state(nv, h, own)
    return out


def _own_pids() -> set[int]:
    try:
        return nodestate.own_pids()
    except ImportError:  # psutil missing: at least this process is ours
        import os

        return {os.getpid()}


def _pci_bus_id(i: int) -> str:
    with contextlib.suppress(Exception):
        import cupy

        return cupy.cuda.runtime.deviceGetPCIBusId(i)
    with contextlib.suppress(Exception):
        import torch

        p = torch.cuda.get_device_properties(i)
        return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
    return ""


def _sysfs_numa(bus_id: str) -> int | None:
    if not bus_id:
        return None
    from pathlib import Path

    short = bus_id.lower()[-12:] if len(bus_id) > 12 else bus_id.lower()
    for cand in (Path("/sys/bus/pci/devices") / short, Path("/sys/bus/pci/devices") / bus_id.lower()):
        f = cand / "numa_node"
        if f.exists():
            with contextlib.suppress(ValueError, OSError):
                return int(f.read_text().strip())
    return None


def peer_access_matrix(n: int) -> tuple[list[list[int]], str]:
    """cudaDeviceCanAccessPeer for every ordered pair (diagonal = 1), and the API used."""
    if n == 0:
        return [], "none"
    try:
        import cupy

        rt = cupy.cuda.runtime
        return [[1 if i == j else int(rt.deviceCanAccessPeer(i, j)) for j in range(n)]
                for i in range(n)], "cupy.cuda.runtime.deviceCanAccessPeer"
    except ImportError:
        import torch

        return [[1 if i == j else int(torch.cuda.can_device_access_peer(i, j)) for j in range(n)]
                for i in range(n)], "torch.cuda.can_device_access_peer"


def nvlink_from_smi() -> dict:
    """Parsed ``nvidia-smi`` topology and NVLink text (each None where unavailable)."""
    out: dict = {"topo_text": nvsmi.run_nvidia_smi("topo", "-m")}
    out["nvlink_status_text"] = nvsmi.run_nvidia_smi("nvlink", "-s")
    out["nvlink_caps_text"] = nvsmi.run_nvidia_smi("nvlink", "-c")
    out["topology"] = None
    if out["topo_text"]:
        with contextlib.suppress(ValueError):
            out["topology"] = nvsmi.parse_topology(out["topo_text"])
    out["nvlink_status"] = nvsmi.parse_nvlink_status(out["nvlink_status_text"] or "")
    out["nvlink_caps"] = nvsmi.parse_nvlink_capabilities(out["nvlink_caps_text"] or "")
    return out
