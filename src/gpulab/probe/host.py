"""The CPU side of the system under test: CPU model, cores, NUMA nodes, RAM, OS, software versions."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numa_nodes() -> list[dict]:
    nodes = []
    base = Path("/sys/devices/system/node")
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = (d / "cpulist").read_text().strip() if (d / "cpulist").exists() else ""
        mem_kb = 0
        meminfo = d / "meminfo"
        if meminfo.exists():
            for ln in meminfo.read_text().splitlines():
                if "MemTotal" in ln:
                    mem_kb = int(ln.split()[-2])
        nodes.append({"node": int(d.name[4:]), "cpus": cpus, "mem_bytes": mem_kb * 1024})
    return nodes


def os_release() -> str:
    try:
        for ln in Path("/etc/os-release").read_text().splitlines():
            if ln.startswith("PRETTY_NAME="):
                return ln.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def host_info() -> dict:
    import socket

    return {
        # the machine's own name, whatever label (GPULAB_HOST) its results are filed under: the
        # fleet view names a folder whose label is another machine's
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False) or 0,
        "logical_cpus": psutil.cpu_count(logical=True) or 0,
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        "numa_nodes": numa_nodes(),
        "ram_bytes": psutil.virtual_memory().total,
        "os": os_release(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def software_versions() -> dict:
    from gpulab.results import package_versions

    v = package_versions()
    try:
        import cupy

        v["cupy"] = cupy.__version__
        v["cuda_runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
        v["cuda_driver"] = str(cupy.cuda.runtime.driverGetVersion())
    except Exception:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        v["nvidia_driver"] = _s(pynvml.nvmlSystemGetDriverVersion())
        v["nvml_cuda_driver"] = str(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        pynvml.nvmlShutdown()
    except Exception:
        pass
    return v


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
