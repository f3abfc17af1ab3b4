"""The seed's reference run: CUDA samples' ``p2pBandwidthLatencyTest`` on 2x RTX A5000 with NVLink 3,
and the one parser of that tool's output.

``p2pBandwidthLatencyTest_a5000.txt`` (package data) is the seed notes' output copied verbatim
(``shared/seed/multi-gpu-notes.md``, whitespace collapsed); the same text is a parser fixture in
``tests/fixtures/``. The transfer stage stores these matrices beside its own, the report compares
with them; both read them here, so both name the link the same (:data:`LINK`: the NVLink generation;
``nvidia-smi topo -m`` shows the same bridge as NV4, a bonded set of 4 links).

:func:`parse` returns {matrix name (the names of :mod:`gpulab.transfer.matrices`): n x n array},
rows the source device, columns the destination.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np

SEED_FILE = Path(__file__).with_name("p2pBandwidthLatencyTest_a5000.txt")
LINK = "NVLink 3"
SEED_SOURCE = f"seed notes: p2pBandwidthLatencyTest, 2x RTX A5000 + {LINK}"

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


@lru_cache(maxsize=1)
def _seed() -> dict[str, np.ndarray]:
    return parse(SEED_FILE.read_text())


def seed_reference() -> dict[str, np.ndarray]:
    """The seed's matrices (copies: a caller may write to its arrays)."""
    return {k: m.copy() for k, m in _seed().items()}
