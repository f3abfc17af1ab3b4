"""System under test, from the probe results: hosts side by side, then each host's GPUs and links."""
from __future__ import annotations

from pathlib import Path

from gpulab.kit.plotting import plt, sns
import pandas as pd  # noqa: E402

from gpulab import outcomes, results  # noqa: E402
from gpulab.kit.html import Figures, esc, note  # noqa: E402

TITLE = "System under test"

METHODS = """
<p>The probe measures nothing: it records what the system is, once per host, before any benchmark.
GPUs come from torch (name, compute capability, SM count, memory) and NVML (clocks, PCIe generation
and width, NUMA node, NVLink state); peer access from the CUDA runtime (can device <i>i</i> map
device <i>j</i>'s memory); the link matrix from <code>nvidia-smi topo -m</code> (NV<i>n</i>: a bond
of <i>n</i> NVLinks; PIX/PXB/PHB/NODE/SYS: PCIe paths of growing length). The CPU side (model,
cores, RAM, NUMA nodes) comes from the operating system, the software versions from the Python
environment that ran the jobs. PCIe: the generation and width the link can train to in its slot
(<i>max</i>, which the transfer stage's PCIe bars use as the limit) and the one it ran at when probed
(<i>now</i>; an idle link trains down to save power, so a lower figure here is not a fault). The L2
cache size marks the sizes other stages must not present as memory bandwidth. What could not be
recorded is listed with the reason.</p>
"""


def _host_kv(f: Path) -> pd.Series:
    return results.read_table(f, "host").set_index("key")["value"]


def _gpu_summary(f: Path, a: dict) -> tuple[str, str]:
    if not a.get("has_gpus"):
        return "none (CPU virtual devices)", "-"
    g = results.read_table(f, "gpus")
    names = ", ".join(f"{n}x {name}" for name, n in g["name"].value_counts().items())
    mem = ", ".join(sorted({f"{b / 2**30:.1f}" for b in g["memory_bytes"]}))
    return names, mem


def _links(f: Path) -> str:
    names = results.list_contents(f)
    if "topology" not in names["matrices"]:
        return "-"
    m, _ = results.read_matrix(f, "topology")
    cells = sorted({str(c) for row in m for c in row if str(c) not in ("X", "")})
    return ", ".join(cells) or "-"


def side_by_side(files: list[Path]) -> pd.DataFrame:
    """One column per host: the facts a reader compares first."""
    cols = {}
    for f in files:
        a = results.read_attrs(f)
        h = _host_kv(f)
        sw = results.read_table(f, "software").set_index("package")["version"]
        gpus, mem = _gpu_summary(f, a)
        cols[str(a.get("host"))] = {
            "GPUs": gpus, "GPU memory (GiB)": mem, "GPU links (topo -m)": _links(f),
            "CPU": h.get("cpu_model", "?"),
            "cores / threads": f"{h.get('physical_cores', '?')} / {h.get('logical_cpus', '?')}",
            "RAM (GiB)": f"{int(h.get('ram_bytes', 0)) / 2**30:.1f}",
            "OS / kernel": f"{h.get('os', '?')} / {h.get('kernel', '?')}",
            "Python": sw.get("python", h.get("python", "?")),
            "torch (CUDA)": f"{sw.get('torch', '?')} ({sw.get('torch.cuda', '-')})",
            "NCCL": sw.get("nccl", "-"), "NVIDIA driver": sw.get("nvidia_driver", "-"),
        }
    return pd.DataFrame(cols).reset_index().rename(columns={"index": ""})


def _gpu_details(f: Path, a: dict, figs: Figures) -> list[str]:
    host = a["host"]
    parts = []
    gpus = results.read_table(f, "gpus")
    cols = [c for c in ("index", "name", "compute_capability", "sm_count", "memory_bytes",
                        "l2_cache_bytes", "sm_clock_max_mhz", "mem_clock_max_mhz", "pci_bus_id",
                        "numa_node", "pcie_gen_max", "pcie_width_max", "pcie_gen_now", "pcie_width_now")
            if c in gpus.columns]
    g = gpus[cols].copy()
    g["memory_bytes"] = (g["memory_bytes"] / 2**30).round(1)
    parts.append(figs.table(g.rename(columns={"memory_bytes": "memory (GiB)"}),
                            f"GPUs of {host} (torch + NVML; clocks in MHz)."))
    names = results.list_contents(f)
    if "peer_access" in names["matrices"]:
        m, meta = results.read_matrix(f, "peer_access")
        fig, ax = plt.subplots(figsize=(1.6 + 0.6 * len(m), 1.2 + 0.5 * len(m)))
        sns.heatmap(pd.DataFrame(m, index=meta.get("rows"), columns=meta.get("cols")), annot=True,
                    cbar=False, cmap="Greens", vmin=0, vmax=1, ax=ax)
        ax.set_xlabel("peer (dst)")
        ax.set_ylabel("device (src)")
        parts.append(figs.figure(fig, f"Peer access on {host} ({meta.get('api')}): 1 = the row's "
                                      "device can map the column's device memory."))
    if "topology" in names["matrices"]:
        m, meta = results.read_matrix(f, "topology")
        df = pd.DataFrame(m, index=meta.get("rows"), columns=meta.get("cols")).reset_index()
        parts.append(figs.table(df.rename(columns={"index": ""}),
                                f"Topology of {host} (nvidia-smi topo -m; NV#: # bonded NVLinks)."))
    if "nvlinks" in names["tables"]:
        nl = results.read_table(f, "nvlinks")
        active = nl[nl["active"] == True] if "active" in nl else nl  # noqa: E712
        parts.append(f"<p>NVLink ({esc(a.get('nvlink_source'))}): {len(active)} active "
                     f"link(s) of {len(nl)} reported.</p>")
    return parts


def _node_state(f: Path, a: dict, figs: Figures) -> list[str]:
    """The node-state checks before the run (gpulab.probe.nodestate): failures first, in words."""
    if outcomes.CHECKS not in results.list_contents(f)["tables"]:
        return []
    c = results.read_table(f, outcomes.CHECKS)
    if c.empty:
        return []
    bad = c[c["verdict"] == outcomes.Verdict.FAIL]
    out = []
    if len(bad):
        out.append(note(f"Node state of {a['host']} before the run: " + "; ".join(
            esc(f"{r.case}: {r.note}") for r in bad.itertuples())))
    out.append(figs.table(c[["check", "case", "verdict", "note"]],
                          f"Node-state checks of {a['host']} (NVML, before the benchmarks): other "
                          "compute processes, clock slowdowns, pending memory repairs."))
    return out


def render(files: list[Path], figs: Figures) -> str:
    parts = [figs.table(side_by_side(files), "The systems under test, hosts side by side (from each "
                        "host's probe result).", css_class="kv")]
    for f in files:
        a = results.read_attrs(f)
        parts.append(f"<h3>Host {esc(a['host'])}</h3>")
        if not a.get("has_gpus"):
            parts.append(note("No CUDA GPU was visible on this host: only the CPU side was recorded, "
                              "and every stage ran on CPU virtual devices."))
        else:
            parts += _gpu_details(f, a, figs)
        parts += _node_state(f, a, figs)
        if outcomes.NOT_APPLICABLE in results.list_contents(f)["tables"]:
            na = results.read_table(f, outcomes.NOT_APPLICABLE)
            if len(na):
                parts.append(figs.table(na, f"Not recorded on {a['host']}, and why."))
        numa = results.read_table(f, "numa")
        parts.append(f"<p>NUMA nodes: {len(numa)}; CPUs per node: "
                     f"{esc('; '.join(str(c) for c in numa['cpus']))}.</p>")
    parts.append("<h3>Software</h3>" + figs.table(software(files), "Software the jobs ran with, hosts "
                                                 "side by side (- where a host lacks the package).",
                                                 max_rows=100, css_class="kv"))
    return "\n".join(parts)


def software(files: list[Path]) -> pd.DataFrame:
    """Package x host table of the versions each host's probe recorded."""
    cols = {str(results.read_attrs(f).get("host")):
            results.read_table(f, "software").set_index("package")["version"] for f in files}
    return pd.DataFrame(cols).fillna("-").rename_axis("package").reset_index()


def headlines(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        a = results.read_attrs(f)
        h = _host_kv(f)
        gpus, mem = _gpu_summary(f, a)
        out.append(f"{a.get('host')}: GPUs {gpus}" + (f" ({mem} GiB each)" if mem != "-" else "")
                   + f"; CPU {h.get('cpu_model', '?')}, {h.get('logical_cpus', '?')} threads, "
                   f"{int(h.get('ram_bytes', 0)) / 2**30:.0f} GiB RAM.")
    return out[:3]
