"""System under test, from the probe results (one block per host)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from gpulab import results  # noqa: E402
from gpulab.report.html import Figures, esc  # noqa: E402

TITLE = "System under test"


def _kv(df: pd.DataFrame, key: str) -> str:
    row = df[df["key"] == key]
    return row["value"].iloc[0] if len(row) else "?"


def render(files: list[Path], figs: Figures) -> str:
    parts = []
    for f in files:
        a = results.read_attrs(f)
        host = results.read_table(f, "host")
        parts.append(f"<h3>Host {esc(a['host'])}</h3><p>CPU: {esc(_kv(host, 'cpu_model'))}, "
                     f"{esc(_kv(host, 'physical_cores'))} cores / {esc(_kv(host, 'logical_cpus'))} "
                     f"threads; RAM {int(_kv(host, 'ram_bytes')) / 2**30:.1f} GiB; "
                     f"OS {esc(_kv(host, 'os'))}, kernel {esc(_kv(host, 'kernel'))}.</p>")
        if not a.get("has_gpus"):
            parts.append('<p class="note">No CUDA GPU was visible on this host: only the CPU side '
                         "was recorded, and every stage ran on CPU virtual devices.</p>")
        else:
            gpus = results.read_table(f, "gpus")
            cols = [c for c in ("index", "name", "compute_capability", "sm_count", "memory_bytes",
                                "sm_clock_max_mhz", "mem_clock_max_mhz", "pci_bus_id", "numa_node",
                                "pcie_gen_max", "pcie_width_max") if c in gpus.columns]
            g = gpus[cols].copy()
            g["memory_bytes"] = (g["memory_bytes"] / 2**30).round(1)
            parts.append(figs.table(g.rename(columns={"memory_bytes": "memory (GiB)"}),
                                    f"GPUs of {a['host']} (torch + NVML)."))
            names = results.list_contents(f)["matrices"]
            if "peer_access" in names:
                m, meta = results.read_matrix(f, "peer_access")
                fig, ax = plt.subplots(figsize=(1.2 + 0.6 * len(m), 1 + 0.5 * len(m)))
                sns.heatmap(pd.DataFrame(m, index=meta["rows"], columns=meta["cols"]), annot=True,
                            cbar=False, cmap="Greens", vmin=0, vmax=1, ax=ax)
                ax.set_xlabel("peer (dst)")
                ax.set_ylabel("device (src)")
                parts.append(figs.figure(fig, f"Peer access on {a['host']} "
                                              f"({meta.get('api')}: 1 = can access)."))
            if "topology" in names:
                m, meta = results.read_matrix(f, "topology")
                df = pd.DataFrame(m, index=meta["rows"], columns=meta["cols"]).reset_index()
                parts.append(figs.table(df.rename(columns={"index": ""}),
                                        f"Topology of {a['host']} (nvidia-smi topo -m)."))
            if "nvlinks" in results.list_contents(f)["tables"]:
                nl = results.read_table(f, "nvlinks")
                active = nl[nl["active"] == True] if "active" in nl else nl  # noqa: E712
                parts.append(f"<p>NVLink ({esc(a.get('nvlink_source'))}): {len(active)} active "
                             f"link(s) of {len(nl)} reported.</p>")
        sw = results.read_table(f, "software")
        parts.append(figs.table(sw, f"Software on {a['host']}."))
    return "\n".join(parts)
