"""Parsers for ``nvidia-smi`` text: ``topo -m``, ``nvlink -status`` and ``nvlink --capabilities``.

They accept both the real tab-separated output and copies whose whitespace was collapsed (as in the
seed notes), and return plain Python structures.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines the header on some drivers
_DEV = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+)$")
_GPU_HEADER = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_LINK_STATUS = re.compile(r"^\s*Link (\d+): (.+?)\s*$")
_LINK_CAP = re.compile(r"^\s*Link (\d+), (.+?): (true|false)\s*$", re.IGNORECASE)


@dataclass
class Topology:
    devices: list[str]  # column/row labels, e.g. ['GPU0', 'GPU1']
    matrix: list[list[str]]  # link type between row and column device ('X', 'NV4', 'SYS', ...)
    affinity: dict[str, dict[str, str]] = field(default_factory=dict)  # per device extra columns
    legend: dict[str, str] = field(default_factory=dict)

    def link(self, a: str, b: str) -> str:
        return self.matrix[self.devices.index(a)][self.devices.index(b)]

    def nvlink_count(self, a: str, b: str) -> int:
        m = re.fullmatch(r"NV(\d+)", self.link(a, b))
        return int(m.group(1)) if m else 0


def run_nvidia_smi(*args: str, timeout: float = 30) -> str | None:
    """stdout of ``nvidia-smi <args>``, or None where the tool is missing or fails."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        p = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def parse_topology(text: str) -> Topology:
    lines = [_ANSI.sub("", ln).rstrip("\n") for ln in text.splitlines()]
    header_idx = next(
        (i for i, ln in enumerate(lines) if re.match(r"^\s*GPU0\b", ln) and "X" not in ln.split()),
        None,
    )
    if header_idx is None:
        raise ValueError("no topology header (a line starting with GPU0) in nvidia-smi topo output")
    header = lines[header_idx]
    tokens = header.split("\t") if "\t" in header else header.split()
    tokens = [t.strip() for t in tokens if t.strip()]
    devices = [t for t in tokens if _DEV.match(t)]
    # Extra column names: with tabs they arrive whole; with collapsed spaces rebuild the known ones.
    extra_cols = tokens[len(devices):]
    if "\t" not in header:
        rest = " ".join(extra_cols)
        extra_cols = [c for c in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID") if c in rest]
    matrix, affinity = [], {}
    for ln in lines[header_idx + 1:]:
        s = ln.strip()
        if not s or s.startswith("Legend"):
            break
        parts = [p.strip() for p in (ln.split("\t") if "\t" in ln else ln.split())]
        parts = [p for p in parts if p]
        if not parts or not _DEV.match(parts[0]):
            continue
        if len(parts) < 1 + len(devices):
            raise ValueError(f"topology row {parts[0]!r} has {len(parts) - 1} link cells, "
                             f"expected {len(devices)}")
        matrix.append(parts[1:1 + len(devices)])
        affinity[parts[0]] = dict(zip(extra_cols, parts[1 + len(devices):]))
    if len(matrix) != len(devices):
        raise ValueError(f"topology has {len(devices)} columns but {len(matrix)} rows")
    legend = {}
    for ln in lines:
        m = re.match(r"^\s*(X|SYS|NODE|PHB|PXB|PIX|NV#)\s*=\s*(.+)$", ln)
        if m:
            legend[m.group(1)] = m.group(2).strip()
    return Topology(devices, matrix, affinity, legend)


def _per_gpu_sections(text: str):
    gpu = None
    for ln in text.splitlines():
        m = _GPU_HEADER.match(ln.strip())
        if m:
            gpu = {"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3)}
            yield gpu, None
        elif gpu is not None and ln.strip():
            yield gpu, ln


def parse_nvlink_status(text: str) -> list[dict]:
    """[{index, name, uuid, links: {link: {'active': bool, 'gbps': float|None, 'raw': str}}}]"""
    out: dict[int, dict] = {}
    for gpu, ln in _per_gpu_sections(text):
        entry = out.setdefault(gpu["index"], {**gpu, "links": {}})
        if ln is None:
            continue
        m = _LINK_STATUS.match(ln)
        if not m:
            continue
        raw = m.group(2)
        speed = re.match(r"([\d.]+)\s*GB/s", raw)
        entry["links"][int(m.group(1))] = {
            "active": bool(speed) and "inactive" not in raw.lower(),
            "gbps": float(speed.group(1)) if speed else None,
            "raw": raw,
        }
    return [out[k] for k in sorted(out)]


def parse_nvlink_capabilities(text: str) -> list[dict]:
    """[{index, name, uuid, links: {link: {capability: bool}}}]"""
    out: dict[int, dict] = {}
    for gpu, ln in _per_gpu_sections(text):
        entry = out.setdefault(gpu["index"], {**gpu, "links": {}})
        if ln is None:
            continue
        m = _LINK_CAP.match(ln)
        if m:
            entry["links"].setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3).lower() == "true"
    return [out[k] for k in sorted(out)]
