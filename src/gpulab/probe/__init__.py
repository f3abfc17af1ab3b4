"""Hardware probe: what the system under test is, recorded once per host.

Writes ``results/probe/<host>.h5`` plus a JSON and a Markdown summary beside it. On a host without
GPUs the CPU side is recorded and ``has_gpus`` says so.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from gpulab import outcomes, results
from gpulab.probe import gpus as gpumod
from gpulab.probe import host as hostmod
from gpulab.probe import nodestate

log = logging.getLogger("gpulab.probe")

_SCALAR = (str, int, float, bool, type(None))


def collect() -> dict:
    """Everything the probe knows, as plain data."""
    info = {"host": hostmod.host_info(), "software": hostmod.software_versions()}
    gpu_list = gpumod.gpu_info()
    info["gpus"] = gpu_list
    info["has_gpus"] = bool(gpu_list)
    info["peer_access"], info["peer_access_api"] = gpumod.peer_access_matrix(len(gpu_list))
    smi = gpumod.nvlink_from_smi() if gpu_list else {"topology": None, "nvlink_status": [],
                                                     "nvlink_caps": [], "topo_text": None}
    info["topology"] = smi["topology"]
    info["topo_text"] = smi.get("topo_text")
    info["nvlink_status_smi"] = smi["nvlink_status"]
    info["nvlink_caps_smi"] = smi["nvlink_caps"]
    return info


def nvlink_table(info: dict) -> tuple[pd.DataFrame, str]:
    """One row per (GPU, link): NVML where it answered, parsed nvidia-smi otherwise."""
    rows = []
    for g in info["gpus"]:
        for link, e in (g.get("nvlinks_nvml") or {}).items():
            rows.append({"gpu": g["index"], "link": int(link), **e})
    if rows:
        return pd.DataFrame(rows), "nvml"
    caps = {c["index"]: c["links"] for c in info["nvlink_caps_smi"]}
    for g in info["nvlink_status_smi"]:
        for link, e in g["links"].items():
            rows.append({"gpu": g["index"], "link": link, "active": e["active"],
                         "gbps": e["gbps"], **caps.get(g["index"], {}).get(link, {})})
    return pd.DataFrame(rows), "nvidia-smi"


def build_result(ctx_stage: str, variant: str, config: dict, info: dict) -> results.Result:
    kind = "cuda" if info["has_gpus"] else "cpu"
    r = results.Result(ctx_stage, variant, config, kind)
    h = info["host"]
    r.attrs.update({
        "has_gpus": info["has_gpus"],
        "gpu_count": len(info["gpus"]),
        "peer_access_api": info["peer_access_api"],
        "note": "" if info["has_gpus"] else "no CUDA GPU visible: CPU side only",
    })
    r.add_table("host", pd.DataFrame(
        [{"key": k, "value": str(v)} for k, v in h.items() if k != "numa_nodes"]))
    numa = pd.DataFrame(h["numa_nodes"] or [{"node": 0, "cpus": "", "mem_bytes": 0}])
    r.add_table("numa", numa, units=outcomes.units_for(numa))
    r.add_table("software", pd.DataFrame(
        [{"package": k, "version": str(v)} for k, v in sorted(info["software"].items())]))
    gpu_rows = [{k: v for k, v in g.items() if isinstance(v, _SCALAR)} for g in info["gpus"]]
    gpus = pd.DataFrame(gpu_rows).fillna(-1) if gpu_rows else pd.DataFrame({"index": pd.Series([], dtype=int)})
    r.add_table("gpus", gpus, units=outcomes.units_for(gpus))
    links, source = nvlink_table(info)
    r.attrs["nvlink_source"] = source
    if not links.empty:
        r.add_table("nvlinks", links.fillna(-1))
    n = len(info["gpus"])
    if n:
        labels = [f"GPU{i}" for i in range(n)]
        r.add_matrix("peer_access", np.array(info["peer_access"], dtype=np.int8), "bool",
                     rows=labels, cols=labels, api=info["peer_access_api"])
    topo = info["topology"]
    if topo is not None:
        r.add_matrix("topology", np.array(topo.matrix, dtype=object), "link type",
                     rows=topo.devices, cols=topo.devices, source="nvidia-smi topo -m")
        r.attrs["topology_affinity"] = topo.affinity
        r.attrs["topology_text"] = info["topo_text"] or ""
    foreign = [{"gpu": g["index"], **p} for g in info["gpus"] for p in g.get("foreign") or []]
    r.add_table("foreign_processes", pd.DataFrame(
        foreign, columns=["gpu", "pid", "name", "used_memory_bytes"]))
    r.add_table(outcomes.CHECKS, outcomes.checks_frame(nodestate.checks(info["gpus"])))
    r.add_table(outcomes.NOT_APPLICABLE, outcomes.not_applicable_frame(not_recorded(info)))
    return r


# What the limits of later stages need from each GPU, and where it comes from.
_NVML_FIELDS = {"pcie_gen_now": "PCIe generation and width (NVML): PCIe bars use them",
                "sm_clock_max_mhz": "clocks, power limit, NUMA node (NVML)"}


def not_recorded(info: dict) -> list[outcomes.NotApplicable]:
    """What the probe could not record on this host, and why."""
    if not info["has_gpus"]:
        why = "no CUDA GPU visible"
        return [outcomes.NotApplicable(w, why) for w in (
            "GPU properties (torch, NVML)", "peer access matrix", "PCIe generation and width",
            "NVLink state", "topology (nvidia-smi topo -m)")]
    out = []
    for key, what in _NVML_FIELDS.items():
        missing = [str(g["index"]) for g in info["gpus"] if g.get(key) is None]
        if missing:
            out.append(outcomes.NotApplicable(what, f"NVML did not answer for GPU(s) {', '.join(missing)} "
                                                    "(pip install nvidia-ml-py; driver access)"))
    if info["topology"] is None:
        out.append(outcomes.NotApplicable("topology (nvidia-smi topo -m)",
                                          "nvidia-smi missing or its output not understood"))
    return out


def summary(info: dict) -> dict:
    h = info["host"]
    return {
        "host": results.host_name(),
        "cpu": f"{h['cpu_model']} ({h['physical_cores']} cores, {h['logical_cpus']} threads)",
        "numa_nodes": len(h["numa_nodes"]),
        "ram_gib": round(h["ram_bytes"] / 2**30, 1),
        "os": h["os"],
        "has_gpus": info["has_gpus"],
        "gpus": [
            {k: g.get(k) for k in ("index", "name", "compute_capability", "sm_count", "memory_bytes",
                                   "sm_clock_max_mhz", "mem_clock_max_mhz", "pci_bus_id", "numa_node")}
            for g in info["gpus"]
        ],
        "peer_access": info["peer_access"],
        "topology": None if info["topology"] is None else {
            "devices": info["topology"].devices, "matrix": info["topology"].matrix},
        "software": info["software"],
    }


def summary_markdown(s: dict) -> str:
    lines = [f"# System under test: {s['host']}", "", f"- CPU: {s['cpu']}",
             f"- NUMA nodes: {s['numa_nodes']}", f"- RAM: {s['ram_gib']} GiB", f"- OS: {s['os']}"]
    if not s["has_gpus"]:
        lines.append("- GPUs: none visible (CPU side only; stages run on CPU virtual devices)")
    else:
        lines += ["", "| GPU | name | CC | SMs | memory (GiB) | max SM clock (MHz) | PCI bus | NUMA |",
                  "|---|---|---|---|---|---|---|---|"]
        for g in s["gpus"]:
            lines.append(f"| {g['index']} | {g['name']} | {g['compute_capability']} | {g['sm_count']} "
                         f"| {g['memory_bytes'] / 2**30:.1f} | {g.get('sm_clock_max_mhz')} "
                         f"| {g['pci_bus_id']} | {g.get('numa_node')} |")
        lines += ["", "Peer access (cudaDeviceCanAccessPeer, row -> column):", ""]
        lines += ["    " + " ".join(str(v) for v in row) for row in s["peer_access"]]
        if s["topology"]:
            lines += ["", "Topology (nvidia-smi topo -m):", "",
                      "    " + "\t".join([""] + s["topology"]["devices"])]
            lines += ["    " + "\t".join([d] + row)
                      for d, row in zip(s["topology"]["devices"], s["topology"]["matrix"])]
    lines += ["", "Software: " + ", ".join(f"{k} {v}" for k, v in sorted(s["software"].items()))]
    return "\n".join(lines) + "\n"


def run(ctx) -> results.Result:
    info = collect()
    log.info("probe: %d GPU(s), CPU %s", len(info["gpus"]), info["host"]["cpu_model"])
    s = summary(info)
    out = Path(ctx.out)
    results.atomic_write_text(out.with_suffix(".json"), json.dumps(s, indent=2, default=str))
    results.atomic_write_text(out.with_suffix(".md"), summary_markdown(s))
    return build_result(ctx.stage, ctx.variant, ctx.config, info)
