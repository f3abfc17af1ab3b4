"""The probe's metrics for baselines and the fleet view (hook of its StageSpec).

Per GPU, the state a sick node shows, one sample each (a state read once has no run-to-run noise:
any change counts): PCIe generation and width, active NVLinks, max SM clock, uncorrected ECC
errors, hardware/thermal clock slowdowns, pending or failed memory repairs, and other compute
processes on the GPU (see :mod:`gpulab.probe.nodestate`). All gate.
"""
from __future__ import annotations

from pathlib import Path

from gpulab import metrics as m
from gpulab import results

# NVML clock event reasons that mean the hardware or the driver held clocks down (idle, app
# clocks and sync boost are normal operation).
SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # sw power cap, hw slowdown, sw/hw thermal, power brake
_STATE = [("pcie_gen_now", "gen", m.HIGHER), ("pcie_width_now", "lanes", m.HIGHER),
          ("sm_clock_max_mhz", "MHz", m.HIGHER), ("ecc_uncorrected_volatile", "errors", m.LOWER),
          ("foreign_processes", "processes", m.LOWER)]
_FLAGS = ("retired_pages_pending", "remapped_rows_pending", "remapped_rows_failed")


def _flag(v) -> float | None:
    s = str(v).lower()
    return 1.0 if s in ("true", "1", "1.0") else 0.0 if s in ("false", "0", "0.0") else None


def extract(path: Path, a: dict, group: str) -> list[dict]:
    if not a.get("has_gpus"):
        return []
    host = a["host"]
    out = []
    gpus = results.read_table(path, "gpus")
    for _, g in gpus.iterrows():
        i = int(g["index"])
        for col, unit, better in _STATE:
            # the probe writes -1 where NVML did not answer: unknown, not zero
            if col in gpus.columns and float(g[col]) >= 0:
                out += m.rows(group, host, "probe", f"probe/gpu={i}/{col}", unit, better, [g[col]])
        if "throttle_reasons" in gpus.columns and float(g["throttle_reasons"]) >= 0:
            bits = bin(int(g["throttle_reasons"]) & SLOWDOWN_BITS).count("1")
            out += m.rows(group, host, "probe", f"probe/gpu={i}/clock_slowdown_reasons",
                          "reasons", m.LOWER, [bits])
        for col in _FLAGS:
            v = _flag(g[col]) if col in gpus.columns else None
            if v is not None:
                out += m.rows(group, host, "probe", f"probe/gpu={i}/{col}", "flag", m.LOWER, [v])
    if "nvlinks" in results.list_contents(path)["tables"]:
        links = results.read_table(path, "nvlinks")
        if "active" in links.columns:
            for gpu, g in links.groupby("gpu"):
                active = sum(1 for v in g["active"] if str(v).lower() in ("true", "1", "1.0"))
                out += m.rows(group, host, "probe", f"probe/gpu={int(gpu)}/nvlinks_active",
                              "links", m.HIGHER, [active])
    return out
