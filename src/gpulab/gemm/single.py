"""Single-device baseline (cuBLAS / oneDNN through ``torch.matmul``) and the bar against plain torch.

The single-device path is ``torch.matmul(a, b, out=c)`` into a preallocated C, the same local GEMM
call the multi-device algorithms make, timed per call by :func:`gpulab.timing.measure` (CUDA
events on GPU). The bar compares it, in the same process, with plain ``torch.matmul(a, b)`` timed
the way most favourable to torch: batches of back-to-back calls between two events.
"""
from __future__ import annotations

import json
import math

import torch

from gpulab import timing
from gpulab.gemm import numerics

BAR_DTYPE = "bf16"
BAR_THRESHOLD = 0.97  # issue 8: within 3% of torch.matmul's TFLOP/s
BAR_BATCH = 10  # back-to-back torch.matmul calls per timed batch
BAR_ROUNDS = 3  # path and reference measured alternately, so clock drift hits both


def _cuda(device: torch.device):
    return device if device.type == "cuda" else None


def time_path(a, b, out, device, warmup: int, repeats: int) -> timing.Stats:
    return timing.measure(lambda: torch.matmul(a, b, out=out), warmup=warmup, repeats=repeats,
                          device=_cuda(device))


def baseline(device: torch.device, sizes, precs, warmup: int, repeats: int, seed: int) -> list[dict]:
    """One row per (size, precision): time, TFLOP/s and the float64 check of the single-device path."""
    rows = []
    for si, (m, n, k) in enumerate(sizes):
        a32, b32 = numerics.random_inputs(m, n, k, seed + si, device)
        for prec in precs:
            a, b = a32.to(prec.dtype), b32.to(prec.dtype)
            out = torch.empty(m, n, dtype=prec.dtype, device=device)
            with numerics.matmul_mode(prec):
                st = time_path(a, b, out, device, warmup, repeats)
            rel = numerics.relative_error(*numerics.error_terms(out, a.double() @ b.double()))
            rows.append({
                "M": m, "N": n, "K": k, "dtype": prec.name, **st.as_dict("time_s"),
                "tflops_median": numerics.tflops(m, n, k, st.median),
                "tflops_max": numerics.tflops(m, n, k, st.min),
                "tflops_min": numerics.tflops(m, n, k, st.max),
                "rel_error": rel, "bound": prec.bound, "passed": bool(rel <= prec.bound),
                # every repetition (JSON list), for baselines and the fleet view
                "time_s_samples": json.dumps([float(f"{x:.6g}") for x in st.samples]),
            })
            del a, b, out
        del a32, b32
    return rows


def _plain_matmul_seconds(a, b, warmup: int, repeats: int) -> list[float]:
    """Per-call seconds of plain ``torch.matmul(a, b)``, from batches of back-to-back calls."""
    for _ in range(warmup):
        torch.matmul(a, b)
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BAR_BATCH):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / BAR_BATCH)
    return samples


def bar_row(device: torch.device, size: int, warmup: int, repeats: int, seed: int) -> dict:
    """The issue's bar: single-device path vs plain torch.matmul, bf16 size^3, same run (CUDA only)."""
    name = f"single-device GEMM vs torch.matmul, {BAR_DTYPE} {size}^3"
    if device.type != "cuda":
        return {"bar": name, "measured": math.nan, "reference": math.nan, "ratio": math.nan,
                "threshold": BAR_THRESHOLD, "passed": False, "unit": "TFLOP/s",
                "note": "not applicable: the bar is defined on a CUDA GPU (H200)"}
    prec = numerics.precision(BAR_DTYPE)
    a32, b32 = numerics.random_inputs(size, size, size, seed, device)
    a, b = a32.to(prec.dtype), b32.to(prec.dtype)
    del a32, b32
    out = torch.empty(size, size, dtype=prec.dtype, device=device)
    path, ref = [], []
    with numerics.matmul_mode(prec):
        for _ in range(BAR_ROUNDS):
            path += time_path(a, b, out, device, warmup, repeats).samples
            ref += _plain_matmul_seconds(a, b, warmup, repeats)
    rel = numerics.relative_error(*numerics.error_terms(out, a.double() @ b.double()))
    measured = numerics.tflops(size, size, size, timing.summarize(path).median)
    reference = numerics.tflops(size, size, size, timing.summarize(ref).median)
    ratio = measured / reference
    return {"bar": name, "measured": measured, "reference": reference, "ratio": ratio,
            "threshold": BAR_THRESHOLD, "passed": bool(ratio >= BAR_THRESHOLD and rel <= prec.bound),
            "unit": "TFLOP/s",
            "note": (f"medians of {len(path)} per-call CUDA-event timings (path, out= preallocated) "
                     f"vs {len(ref)} batches of {BAR_BATCH} back-to-back torch.matmul calls, "
                     f"alternating; rel. error {rel:.2e} (bound {prec.bound:g})")}
