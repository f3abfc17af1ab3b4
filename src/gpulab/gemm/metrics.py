"""The GEMM stage's metrics for baselines and the fleet view (hook of its StageSpec).

TFLOP/s per repetition (2MNK / seconds) of every row with ``time_s_samples``: the ``single`` table
(the single-device baseline) and, where the stage measured it, the ``per_gpu`` table (each GPU of
the node at a size and duration that reaches steady clocks, the health figure). All gate, except that where the per-GPU figure exists the ``single`` rows
only inform: their small sizes (~50 us of work at 2048^3 on an H200) swing with the clocks within
one healthy run and are kept as the precision checks' workload, not as the node's GEMM figure.
"""
from __future__ import annotations

from pathlib import Path

from gpulab import metrics as m
from gpulab import results

TABLES = ("single", "per_gpu")


def extract(path: Path, a: dict, group: str) -> list[dict]:
    out = []
    have = results.list_contents(path)["tables"]
    single_cls = m.INFORMATIONAL if "per_gpu" in have else m.GATING
    for table in TABLES:
        if table not in have:
            continue
        df = results.read_table(path, table)
        if "time_s_samples" not in df.columns:
            continue
        for _, r in df.iterrows():
            flop = 2.0 * int(r["M"]) * int(r["N"]) * int(r["K"])
            vals = [flop / t / 1e12 for t in m.json_list(r["time_s_samples"]) if t > 0]
            where = f"/gpu={int(r['gpu'])}" if "gpu" in df.columns else ""
            metric = f"gemm/{table}{where}/{r['dtype']}/{int(r['M'])}x{int(r['N'])}x{int(r['K'])}"
            out += m.rows(group, a["host"], "gemm", metric, "TFLOP/s", m.HIGHER, vals,
                          single_cls if table == "single" else m.GATING)
    return out
