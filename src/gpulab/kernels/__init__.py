"""Kernels stage: the seed's divide kernel, its split over devices, and independent jobs.

Variants of the stage script (``--variant``):

- ``main``: the divide benchmark on one device (RawKernels naive / vec8 / vec16 and torch on CUDA,
  numpy and torch on CPU) against a same-size copy, then the image split over all devices;
- ``job<i>``: one independent job (Snakemake gives it one GPU through ``gpulab-slot``);
- ``jobs``: aggregates the job results given with ``--jobs``.
"""
from __future__ import annotations

import copy
import logging
import re
from pathlib import Path

import pandas as pd

from gpulab import config as cfgmod
from gpulab import results
from gpulab.kernels import bench, divide, jobs, split
from gpulab.kernels.bars import bar

log = logging.getLogger("gpulab.kernels")

SCHEMA = "kernels"  # its packaged schema, gpulab/kernels/schema.yaml
H200_D2D_GBPS = 4300.0  # known figure: torch D2D copy on an H200, read + write


def settings(section: dict) -> dict:
    """The stage's config section validated, with the schema's defaults filled in."""
    cfg = copy.deepcopy(section or {})
    cfgmod.validate(cfg, SCHEMA)
    divide.check_divisor(cfg["divisor"])
    return cfg


def extra_args(ap) -> None:
    ap.add_argument("--jobs", nargs="*", type=Path, default=[],
                    help="job results to aggregate (variant 'jobs')")


def run(ctx) -> results.Result:
    ctx.config = settings(ctx.config)
    if ctx.variant == "main":
        return run_main(ctx)
    m = re.fullmatch(r"job(\d+)", ctx.variant)
    if m:
        return jobs.run_job(ctx, int(m.group(1)))
    if ctx.variant == "jobs":
        return jobs.aggregate(ctx, list(ctx.extra.get("jobs") or []))
    raise ValueError(f"kernels: unknown variant {ctx.variant!r} (main, job<N> or jobs)")


def split_settings(cfg: dict) -> dict:
    return {**cfg["split"], **{k: cfg[k] for k in ("divisor", "block", "kernel", "warmup",
                                                   "repeats")}}


def run_main(ctx) -> results.Result:
    cfg = ctx.config
    devices = ctx.devices()
    kind = devices[0].kind
    divide.one_thread_per_cpu_device(kind)
    ran, not_applicable = divide.variants_for(kind, cfg["variants"])
    log.info("kernels: %d %s device(s) (%s); variants %s", len(devices), kind, devices[0].name, ran)
    div_df = bench.run_divide(devices[0], cfg)
    split_df, phases_df = split.run_split(devices, split_settings(cfg))
    r = ctx.new_result(kind, devices=[d.as_dict() for d in devices], device_name=devices[0].name,
                       n_devices=len(devices), variants_not_applicable=not_applicable,
                       split_kernel=divide.kernel_for(kind, cfg["kernel"]),
                       all_verified=bool(div_df["verified"].all() and split_df["verified"].all()),
                       note=_note(kind, len(devices), not_applicable))
    r.add_table("divide", div_df, units=bench.DIVIDE_UNITS)
    r.add_table("split", split_df, units=split.SPLIT_UNITS)
    r.add_table("split_phases", phases_df, units=split.PHASE_UNITS)
    r.add_table("bars", main_bars(kind, devices[0].name, len(devices), div_df, split_df),
                units={"unit": ""})
    if not r.attrs["all_verified"]:
        raise RuntimeError("kernels: a result did not match numpy (see the 'verified' columns)")
    return r


def _note(kind: str, n: int, na: list[str]) -> str:
    parts = []
    if na:
        parts.append(f"not applicable on {kind}: {', '.join(na)}"
                     + (" (CuPy RawKernels need CUDA)" if kind == "cpu" else ""))
    if n == 1:
        parts.append("one device: the multi-device split comparisons are not applicable")
    return "; ".join(parts)


def _gbps(df: pd.DataFrame, variant: str, size: int):
    row = df[(df.variant == variant) & (df.size_bytes == size)]
    return float(row["gbps"].iloc[0]) if len(row) else None


def _mode(df: pd.DataFrame, **kw):
    sel = df
    for k, v in kw.items():
        sel = sel[sel[k] == v]
    return sel.iloc[0] if len(sel) else None


def main_bars(kind: str, name: str, n: int, div_df: pd.DataFrame, split_df: pd.DataFrame):
    big = int(div_df["size_bytes"].max())
    cuda = kind == "cuda"
    na = "" if cuda else "needs CUDA (CuPy RawKernels); not applicable on CPU"
    g = {v: _gbps(div_df, v, big) for v in ("copy", "naive", "vec8", "vec16", "torch")}
    rows = [
        bar("vec16 divide vs same-size copy (largest size)", g["vec16"], g["copy"],
            0.8 if cuda else None, "GB/s", na or "copy = roofline; 0.8 is our target"),
        bar("vec8 (seed char_vec) vs naive divide", g["vec8"], g["naive"],
            1.0 if cuda else None, "GB/s", na or "vectorised loads should not be slower"),
        bar("vec16 vs torch.floor_divide", g["vec16"], g["torch"], 1.0 if cuda else None,
            "GB/s", na or "hand-written kernel vs library"),
    ]
    if cuda and "H200" in name:
        rows.append(bar("torch D2D copy vs known H200 figure", g["copy"], H200_D2D_GBPS, 0.9,
                        "GB/s", "known figure: about 4.3 TB/s read+write"))
    else:
        rows.append(bar("torch D2D copy vs known H200 figure", g["copy"], None, None, "GB/s",
                        f"not applicable: device is {name}"))
    gpu_note = "" if cuda else "CPU virtual devices: measured for reference, the bar is for GPUs"
    thr = (lambda t: t if cuda else None)
    pin = bool(cuda and split_df["pinned"].any())  # compare with pinned buffers where measured
    base = dict(threads="per_device", pinned=pin)
    serial = _mode(split_df, devices=n, chunks=1, **base)
    piped = split_df[(split_df.devices == n) & (split_df.chunks > 1)
                     & (split_df.threads == "per_device") & (split_df.pinned == pin)]
    piped = piped.iloc[0] if len(piped) else None
    if serial is not None and piped is not None:
        rows.append(bar("pipelined (chunked) vs serial copy/compute", piped.gbps, serial.gbps,
                        thr(1.0), "GB/s", gpu_note or "overlap of copies and kernels per device"))
    if n < 2 or serial is None:
        for b in ("split over all devices vs one device (speed-up / N)",
                  "one host thread per device vs one for all"):
            rows.append(bar(b, None, None, None, "1",
                            "not applicable: needs at least 2 devices" if n < 2 else
                            "not applicable: no serial mode was measured"))
    else:
        one = _mode(split_df, devices=1, chunks=1, **base)
        rows.append(bar("split over all devices vs one device (speed-up / N)",
                        one.wall_s_median / serial.wall_s_median, n, thr(0.8), "1",
                        gpu_note or f"ideal speed-up is N = {n}"))
        single = _mode(split_df, devices=n, chunks=1, threads="single", pinned=pin)
        rows.append(bar("one host thread per device vs one for all", serial.gbps, single.gbps,
                        thr(0.95), "GB/s", gpu_note or "serial copies; pinned host memory"))
    return pd.DataFrame(rows)
