"""Multi-device sorting (issue 7): baselines, P2P merge sort, HET sort, radix-partition sort.

``run(ctx)`` is the stage: every case of the config (a size sweep and a key type x distribution
matrix) on every algorithm and device count, timed with a phase breakdown and verified, plus the
issue's bars. The algorithms live in ``p2p``, ``het`` and ``radix`` and run over an array backend
(``backend``: numpy for CPU virtual devices, CuPy for CUDA devices).
"""
from __future__ import annotations

import pandas as pd

from gpulab import outcomes
from gpulab.outcomes import NotApplicable
from gpulab.stage import StageContext, progress


def _table(result, name: str, rows: list[dict], columns: list[str]) -> None:
    df = pd.DataFrame(rows, columns=None if rows else columns)
    result.add_table(name, df, units=outcomes.units_for(df))


def run(ctx: StageContext):
    from gpulab.sort.bench import Bench, cases, speedup_bars

    cfg = ctx.settings
    devices = ctx.devices()
    kind = devices[0].kind
    bench = Bench(cfg, kind, len(devices), devices[0].name)
    try:
        for i, case in enumerate(progress(cases(cfg), "sort cases")):
            bench.run_case(case, cfg.seed + i)
        logic = bench.logic_check(cfg.seed + 2000)
        extra = bench.moved_keys_checks(cfg.seed + 3000)
        harness = bench.harness_check(cfg.seed + 1000)
        if harness is not None:
            extra.append(harness)
    finally:
        bench.close()
    checks = bench.checks(logic) + extra
    bars = speedup_bars(bench.rows, kind, len(devices))
    result = ctx.new_result(kind, device_name=devices[0].name, devices_available=len(devices),
                            device_counts=bench.counts,
                            conventions="time: host-to-host runs include H2D and D2H (wall clock, "
                                        "all devices synchronised at phase boundaries); device "
                                        "runs time the sort of device-resident keys (CUDA events). "
                                        "keys_moved: keys that crossed the GPU-GPU interconnect, "
                                        "each direction counted; bytes = keys x key size.")
    from gpulab.sort.bench import KEYS

    _table(result, "runs", bench.rows, KEYS)
    _table(result, "phases", bench.phase_rows, KEYS + ["phase"])
    _table(result, "merge_steps", bench.steps, ["round", "pivot", "keys_moved"])
    _table(result, "radix_balance", bench.balance, ["histogram_passes", "tie_keys"])
    _table(result, "logic_check", logic, ["algorithm", "logical_devices", "verified"])
    _table(result, "failures", bench.failures, ["what", "error", "traceback"])
    result.add_table("not_applicable", outcomes.not_applicable_frame(
        NotApplicable(s["what"], s["reason"]) for s in bench.skipped))
    result.add_table("checks", outcomes.checks_frame(checks))
    result.add_table("bars", outcomes.bars_frame(bars))
    if kind == "cuda" and bench.counts:
        peer = bench.backends[max(bench.counts)].peer
        result.add_matrix("peer_access", peer.astype(int), "1", rows=range(len(peer)),
                          cols=range(len(peer)), api="cudaDeviceCanAccessPeer")
    return result
