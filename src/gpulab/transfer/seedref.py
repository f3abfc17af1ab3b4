"""Parse p2pBandwidthLatencyTest output into matrices (the seed's RTX A5000 table is the reference).

The packaged ``seed_a5000.txt`` is the seed's table as printed; ``parse`` returns
{matrix name (same names as :mod:`gpulab.transfer.matrices`): n x n array}.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

SEED_FILE = Path(__file__).with_name("seed_a5000.txt")
SEED_SOURCE = "seed notes: p2pBandwidthLatencyTest on 2x NVIDIA RTX A5000 (NVLink NV4)"

# heading -> (test, p2p); latency blocks hold a GPU and a CPU sub-table.
_HEADINGS = [
    (re.compile(r"^Unidirectional P2P=(\w+) Bandwidth"), "uni"),
    (re.compile(r"^Bidirectional P2P=(\w+) Bandwidth"), "bi"),
    (re.compile(r"^P2P=(\w+) Latency"), "latency"),
]


def _read_block(lines: list[str], i: int, n: int) -> np.ndarray:
    """The n rows after the header line at ``i`` ('D\\D 0 1' or 'GPU 0 1')."""
    rows = [list(map(float, lines[i + 1 + k].split()[1:])) for k in range(n)]
    if any(len(r) != n for r in rows):
        raise ValueError(f"line {i + 2}: expected {n} values per row")
    return np.array(rows)


def parse(text: str) -> dict[str, np.ndarray]:
    lines = [ln.strip() for ln in text.splitlines()]
    n = sum(1 for ln in lines if re.match(r"^Device: \d+,", ln))
    if n == 0:
        raise ValueError("not p2pBandwidthLatencyTest output: no 'Device: N, ...' lines")
    out: dict[str, np.ndarray] = {}
    for i, ln in enumerate(lines):
        for pat, test in _HEADINGS:
            m = pat.match(ln)
            if not m:
                continue
            p2p = m.group(1).lower()
            if test == "latency":
                out[f"latency_ce_p2p_{p2p}_gpu_us"] = _read_block(lines, i + 1, n)
                out[f"latency_ce_p2p_{p2p}_cpu_us"] = _read_block(lines, i + 2 + n, n)
            else:
                out[f"{test}_ce_p2p_{p2p}_GBps"] = _read_block(lines, i + 1, n)
    if not out:
        raise ValueError("no bandwidth or latency matrices found")
    return out


def seed_reference() -> dict[str, np.ndarray]:
    return parse(SEED_FILE.read_text())
