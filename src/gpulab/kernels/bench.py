"""Single-device divide benchmark: every variant and size against a same-size copy (the roofline).

Bytes are counted as read + written (2 x image bytes) for the kernels and for the copy alike, so
``fraction_of_copy`` is the share of the device's measured copy bandwidth the kernel reaches.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np
import pandas as pd

from gpulab import timing
from gpulab.devices import Device
from gpulab.kernels import divide
from gpulab.kernels.settings import Settings

log = logging.getLogger("gpulab.kernels")


# Calls per timed sample on a GPU at least: one event pair around one call also times the launch
# latency before it, and then a launch-bound call reads as half host issue, half GPU time (an H100
# at the quick preset's 4 MB, one call per sample: host issue 0.47-0.59 of the GPU time, vs
# 0.93-0.98 in batches of 64; docs/runs/2026-12-06-quick-h100/probe_kernels.txt). Batches of 8
# still read as low as 0.74 in a stage run on an H100 (the latency shared by 8 calls), close to
# LAUNCH_BOUND_FRACTION; 32 calls leave a quarter of that share.
CUDA_MIN_CALLS = 32


def inner_calls(size: int, batch_bytes: int, at_least: int = 1) -> int:
    """Calls per timed sample: enough that a sample moves ``batch_bytes`` (launch cost amortised),
    and ``at_least``."""
    return max(at_least, min(1000, math.ceil(batch_bytes / size)))


# A GPU row is launch-bound when the host takes at least this share of the GPU's per-call time to
# issue one call: the GPU then waits on the host, and the figure is the host's launch rate, not the
# kernel's. An H100 at the quick preset's 4 MB read vec16 at 263 GB/s and torch.floor_divide at
# 338 GB/s, ~30 us per call for ~2 us of memory traffic, and failed a kernel-vs-kernel bar on a
# healthy GPU. In batches of CUDA_MIN_CALLS or more, launch-bound rows read 0.93-0.98 and rows
# from 64 MiB up at most 0.36 (docs/runs/2026-12-06-quick-h100/probe_kernels.txt).
LAUNCH_BOUND_FRACTION = 0.7


def _timed(fn, inner: int, device: Device, warmup: int, repeats: int) -> tuple[timing.Stats, float]:
    """Per-call stats of fn, and the median host time to issue one call (perf_counter around the
    calls of a sample, inside the CUDA-event pair: queueing, not the work, on a GPU)."""
    issue = []

    def batch():
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        issue.append((time.perf_counter() - t0) / inner)

    st = timing.measure(batch, warmup=warmup, repeats=repeats,
                        device=device.torch_device if device.kind == "cuda" else None)
    return timing.summarize([s / inner for s in st.samples]), float(np.median(issue[-repeats:]))


def l2_bytes(device: Device) -> int:
    """The device's L2 cache size (0 where unknown: CPU virtual devices)."""
    if device.kind != "cuda":
        return 0
    import torch

    return int(getattr(torch.cuda.get_device_properties(device.index), "L2_cache_size", 0) or 0)


def launch_bound(host_issue_s: float, gpu_s: float) -> bool:
    """The GPU was starved by the host: issuing a call took most of the call's GPU time."""
    return gpu_s > 0 and host_issue_s >= LAUNCH_BOUND_FRACTION * gpu_s


def _row(variant, size, width, st: timing.Stats, inner, verified, copy_gbps=None, l2=0,
         host_issue_s=float("nan"), gpu=False) -> dict:
    moved = 2 * size  # read + write
    gbps = moved / st.median / 1e9
    return {"variant": variant, "size_bytes": size, "bytes_per_thread": width,
            **st.as_dict("time_s"), "gbps": gbps, "gbps_min": moved / st.max / 1e9,
            "gbps_max": moved / st.min / 1e9,
            "fraction_of_copy": gbps / copy_gbps if copy_gbps else 1.0,
            # input and output both fit in L2: the figure is cache bandwidth, not memory
            "cache_resident": bool(l2) and moved <= l2,
            "calls_per_sample": inner, "host_issue_s": host_issue_s,
            "launch_bound": bool(gpu) and launch_bound(host_issue_s, st.median),
            "verified": bool(verified)}


def run_divide(device: Device, cfg: Settings) -> pd.DataFrame:
    """One row per (variant, size), plus the ``copy`` rows: the same-size torch copy."""
    import torch

    div = cfg.divisor
    runnable, _ = divide.variants_for(device.kind, cfg.variants)
    rows = []
    l2 = l2_bytes(device)
    for size in cfg.sizes_bytes:
        img = divide.make_image(size, seed=size)
        ref = divide.reference(img, div)
        # Start every output at 255 - ref: differs from the answer in every byte, never zeros.
        wrong = (np.uint8(255) - ref)
        inp = torch.from_numpy(img).to(device.torch_device)
        inner = inner_calls(size, cfg.batch_bytes, CUDA_MIN_CALLS if device.kind == "cuda" else 1)
        dst = torch.from_numpy(wrong).to(device.torch_device)
        gpu = device.kind == "cuda"
        st, issue = _timed(lambda: dst.copy_(inp), inner, device, cfg.warmup, cfg.repeats)
        copy_ok = np.array_equal(dst.cpu().numpy(), img)
        copy_row = _row("copy", size, 1, st, inner, copy_ok, l2=l2, host_issue_s=issue, gpu=gpu)
        rows.append(copy_row)
        del dst
        for v in runnable:
            if v == "numpy":
                out = wrong.copy()
                fn = divide.divider(v, out, img, div)
            else:
                out = torch.from_numpy(wrong).to(device.torch_device)
                fn = divide.divider(v, out, inp, div, cfg.block)
            st, issue = _timed(fn, inner, device, cfg.warmup, cfg.repeats)
            got = out if isinstance(out, np.ndarray) else out.cpu().numpy()
            ok = np.array_equal(got, ref)
            rows.append(_row(v, size, divide.WIDTH.get(v, 0), st, inner, ok, copy_row["gbps"], l2,
                             host_issue_s=issue, gpu=gpu and v != "numpy"))
            log.info("divide %-6s %12d B: %8.1f GB/s (%.0f%% of copy)%s%s", v, size, rows[-1]["gbps"],
                     100 * rows[-1]["fraction_of_copy"],
                     "  launch-bound" if rows[-1]["launch_bound"] else "",
                     "" if ok else "  VERIFICATION FAILED")
            del out
        del inp
    return pd.DataFrame(rows)


# What the divide table's bandwidth counts, beside its unit (gpulab.outcomes.units_for).
DIVIDE_NOTES = {"gbps": "read+write", "host_issue_s": "host time to queue one call"}
