"""The collectives stage's metrics for baselines and the fleet view (hook of its StageSpec).

The ``samples`` table (seconds per call per repetition) -> bus bandwidth (nccl-tests' busbw), a
gating metric. A run of one rank has no communication (its bus factor is 0: the call measures a
launch), so it gives no metric at all: not a health figure.
"""
from __future__ import annotations

from pathlib import Path

from gpulab import metrics as m
from gpulab import results
from gpulab.collectives import formulas


def extract(path: Path, a: dict, group: str) -> list[dict]:
    if "samples" not in results.list_contents(path)["tables"]:
        return []
    s = results.read_table(path, "samples")
    n = int(a.get("world_size") or 1)
    out = []
    for (kind, op, mode, size), g in s.groupby(["kind", "op", "mode", "bytes"], sort=True):
        if formulas.bus_factor(op, n) <= 0:
            continue  # one rank: nothing crosses a link
        times = [float(t) for t in g.sort_values("repetition")["time_s"]]
        vals = [formulas.busbw(op, n, int(size), t) for t in times if t > 0]
        metric = f"collectives/{a.get('variant', 'default')}/{kind}/{op}/{mode}/bytes={int(size)}/busbw"
        out += m.rows(group, a["host"], "collectives", metric, "GB/s", m.HIGHER, vals)
    return out
