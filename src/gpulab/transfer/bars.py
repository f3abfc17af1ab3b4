"""The issue's bars (GPU) and the list of what was measured or not applicable on this host."""
from __future__ import annotations

import math

import pandas as pd

BAR_THRESHOLD = 0.95  # measured / reference must be at least this ("within 5%")
SPREAD_THRESHOLD = 0.05  # (max - min) / median of the samples must be at most this
BAR_COLUMNS = ["bar", "measured", "reference", "ratio", "threshold", "passed", "unit", "note"]
BAR_UNITS = {"measured": "see unit", "reference": "see unit", "ratio": "measured/reference",
             "threshold": "ratio (bandwidth) or (max-min)/median (spread)"}


def ratio_bar(bar: str, measured: float, reference: float, note: str) -> dict:
    ratio = measured / reference if reference else float("nan")
    return {"bar": bar, "measured": measured, "reference": reference, "ratio": ratio,
            "threshold": BAR_THRESHOLD, "passed": "yes" if ratio >= BAR_THRESHOLD else "no",
            "unit": "GB/s", "note": note}


def spread_bar(bar: str, spread: float, note: str) -> dict:
    return {"bar": bar, "measured": spread, "reference": float("nan"), "ratio": float("nan"),
            "threshold": SPREAD_THRESHOLD, "passed": "yes" if spread <= SPREAD_THRESHOLD else "no",
            "unit": "(max-min)/median", "note": note}


def not_applicable(bar: str, reason: str) -> dict:
    return {"bar": bar, "measured": math.nan, "reference": math.nan, "ratio": math.nan,
            "threshold": math.nan, "passed": "n/a", "unit": "", "note": reason}


GPU_BARS = ["same-device copy vs torch copy_ (P2P=Enabled matrix)",
            "same-device copy vs torch copy_ (P2P=Disabled matrix)",
            "pinned H2D cudaMemcpyAsync vs torch pinned copy_",
            "run-to-run spread: same-device copy", "run-to-run spread: pinned H2D"]


def gpu_bars(p2p_rows: pd.DataFrame, torch_d2d: pd.DataFrame, h2d: dict) -> pd.DataFrame:
    rows = []
    diag = p2p_rows[(p2p_rows.test == "uni") & (p2p_rows.mechanism == "ce") & (p2p_rows.src == p2p_rows.dst)]
    for t in torch_d2d.itertuples():
        for mode in ("enabled", "disabled"):
            m = diag[(diag.p2p == mode) & (diag.src == t.device)].iloc[0]
            rows.append(ratio_bar(f"same-device copy vs torch copy_ (P2P={mode.capitalize()} matrix), "
                                  f"GPU{t.device}", m.value_median, t.value_median,
                                  f"{int(t.bytes)} B x {int(t.copies)} copies, read+write counted"))
        m = diag[(diag.p2p == "enabled") & (diag.src == t.device)].iloc[0]
        rows.append(spread_bar(f"run-to-run spread: same-device copy, GPU{t.device}", m.spread,
                               f"{int(m.repeats)} samples"))
    mine, ref = h2d["mine"], h2d["torch"]
    rows.append(ratio_bar("pinned H2D cudaMemcpyAsync vs torch pinned copy_, GPU0", mine["value_median"],
                          ref["value_median"], f"{mine['bytes']} B x {mine['copies']} copies"))
    rows.append(spread_bar("run-to-run spread: pinned H2D, GPU0", mine["spread"],
                           f"{mine['repeats']} samples"))
    return pd.DataFrame(rows, columns=BAR_COLUMNS)


def cpu_bars() -> pd.DataFrame:
    return pd.DataFrame([not_applicable(b, "needs a CUDA GPU; this host ran on CPU virtual devices")
                         for b in GPU_BARS], columns=BAR_COLUMNS)


def applicability(kind: str, n_gpus: int, peer_pairs: int) -> pd.DataFrame:
    gpu = kind == "cuda"
    multi = gpu and n_gpus >= 2
    why_gpu = "" if gpu else "needs a CUDA GPU (CPU virtual devices here)"
    why_multi = "" if multi else (why_gpu or f"needs >= 2 GPUs ({n_gpus} visible)")
    items = [
        ("P2P matrices, same-device cells (copy engine, SM copy)", gpu, why_gpu),
        ("P2P matrices, cross-device cells", multi, why_multi),
        ("SM copy across devices (needs peer access)", multi and peer_pairs > 0,
         why_multi or ("" if peer_pairs else "no pair supports peer access")),
        ("P2P size sweep 0->0", gpu, why_gpu),
        ("P2P size sweep 0->1", multi, why_multi),
        ("host <-> device: pinned/pageable, async/blocking, size sweep", gpu, why_gpu),
        ("host <-> device: one thread for all GPUs vs one per GPU", gpu,
         why_gpu or ("" if multi else "measured, but with 1 GPU both modes issue the same copies")),
        ("hybrid split transfer (P2P + host path)", multi, why_multi),
        ("cudaMalloc cost without peer access", gpu, why_gpu),
        ("cudaMalloc cost with peer access", multi and peer_pairs > 0,
         why_multi or ("" if peer_pairs else "no pair supports peer access")),
        ("bars vs torch (same-device copy, pinned H2D)", gpu, why_gpu),
        ("host memcpy: buffer to buffer, size sweep", True, ""),
        ("host memcpy: thread scaling", True, ""),
        ("CPU virtual-device matrices (memcpy between threads' buffers)", not gpu,
         "" if not gpu else "GPU host: the GPU matrices are measured instead"),
    ]
    return pd.DataFrame([{"measurement": m, "applicable": bool(a), "reason": r} for m, a, r in items])
