"""The health figure of the GEMM stage: every GPU of the node, at steady clocks.

A 2048^3 GEMM is ~50 us of work on an H200: its samples swing 2.5x within one healthy run with
what the clocks happen to do, and another tenant that keeps the clocks up makes it look *faster*.
So the health figure is a large GEMM (8192^3 bf16: sustained ~660 TFLOP/s on the H200,
shared/notes/h200-measured.md) per GPU, in samples of at least ``seconds`` each (a batch of
back-to-back calls timed with CUDA events on that GPU), after a warm-up that runs until two
successive readings agree: the throughput of a ~0.25 s chunk within 2 % of the previous chunk's
and, where NVML answers, the SM clock within 1 % of its previous reading (at most
``warmup_max_s``; a row says whether the warm-up became stable). On CPU the virtual devices share
the same cores, so the CPU is measured once, as device 0, at ``cpu_size``.
"""
from __future__ import annotations

import contextlib
import json
import math
import time

import torch

from gpulab.gemm import numerics

CHUNK_S = 0.25
RATE_TOL = 0.02
CLOCK_TOL = 0.01


def _clock_mhz(device: torch.device) -> float:
    if device.type != "cuda":
        return math.nan
    with contextlib.suppress(Exception):
        return float(torch.cuda.clock_rate(device))
    return math.nan


def _batch_s(fn, n: int, device: torch.device) -> float:
    """Seconds of ``n`` back-to-back calls: CUDA events on the device's current stream, else
    the host clock."""
    if device.type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t0


def warm_up(fn, device: torch.device, max_s: float) -> tuple[float, bool, float, float]:
    """Run ``fn`` in ~CHUNK_S chunks until rate and clock settle. Returns (seconds per call of the
    last chunk, stable, seconds spent, SM clock MHz at the end)."""
    t_call = _batch_s(fn, 1, device)  # the first call: allocation, kernel selection
    t_call = _batch_s(fn, 1, device) or 1e-6
    start, prev, prev_clock, stable = time.perf_counter(), None, math.nan, False
    while True:
        n = max(1, int(CHUNK_S / t_call))
        t_call = _batch_s(fn, n, device) / n
        clock = _clock_mhz(device)
        rate_ok = prev is not None and abs(prev / t_call - 1) <= RATE_TOL
        clock_ok = math.isnan(clock) or (not math.isnan(prev_clock)
                                         and abs(clock / prev_clock - 1) <= CLOCK_TOL)
        if rate_ok and clock_ok:
            stable = True
            break
        if time.perf_counter() - start > max_s:
            break
        prev, prev_clock = t_call, clock
    return t_call, stable, time.perf_counter() - start, clock


def measure(devices: list[torch.device], size: int, precs, seconds: float, repeats: int,
            warmup_max_s: float, seed: int) -> list[dict]:
    """One row per (device, precision): per-call seconds of each ``seconds``-long sample. Each GPU
    is measured under ``torch.cuda.device(d)``, so its events and calls land on its own stream."""
    rows = []
    for idx, dev in enumerate(devices):
        ctx = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
        with ctx:
            rows += on_device(idx, dev, size, precs, seconds, repeats, warmup_max_s, seed)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def on_device(idx: int, dev: torch.device, size: int, precs, seconds: float, repeats: int,
              warmup_max_s: float, seed: int) -> list[dict]:
    rows = []
    a32, b32 = numerics.random_inputs(size, size, size, seed, dev)
    for prec in precs:
        a, b = a32.to(prec.dtype), b32.to(prec.dtype)
        out = torch.empty(size, size, dtype=prec.dtype, device=dev)
        with numerics.matmul_mode(prec):
            def fn():
                return torch.matmul(a, b, out=out)

            t_call, stable, warm_s, clock = warm_up(fn, dev, warmup_max_s)
            n = max(1, math.ceil(seconds / t_call))
            per_call = [_batch_s(fn, n, dev) / n for _ in range(repeats)]
            clock_end = _clock_mhz(dev)
        med = sorted(per_call)[len(per_call) // 2]
        rows.append({
            "gpu": idx, "M": size, "N": size, "K": size, "dtype": prec.name,
            "calls_per_sample": n, "sample_s": n * med, "warmup_s": warm_s,
            "warmup_stable": stable, "sm_clock_mhz_start": clock, "sm_clock_mhz_end": clock_end,
            "tflops_median": numerics.tflops(size, size, size, med),
            # in measurement order, for baselines and the fleet view
            "time_s_samples": json.dumps([float(f"{x:.6g}") for x in per_call]),
        })
        del a, b, out
    return rows
