"""Kernels stage: the seed's divide kernel, its split over devices, and independent jobs.

Variants of the stage script (``--variant``):

- ``main``: the divide benchmark on one device (RawKernels naive / vec8 / vec16 and torch on CUDA,
  numpy and torch on CPU) against a same-size copy, then the image split over all devices;
- ``job<i>``: one independent job (Snakemake gives it one GPU through ``gpulab-slot``);
- ``jobs``: aggregates the job results given with ``--jobs``.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pandas as pd

from gpulab import outcomes, results
from gpulab.kernels import bars, bench, divide, jobs, split

log = logging.getLogger("gpulab.kernels")

def extra_args(ap) -> None:
    ap.add_argument("--jobs", nargs="*", type=Path, default=[],
                    help="job results to aggregate (variant 'jobs')")


def run(ctx) -> results.Result:
    if ctx.variant == "main":
        return run_main(ctx)
    m = re.fullmatch(r"job(\d+)", ctx.variant)
    if m:
        return jobs.run_job(ctx, int(m.group(1)))
    if ctx.variant == "jobs":
        return jobs.aggregate(ctx, list(ctx.extra.get("jobs") or []))
    raise ValueError(f"kernels: unknown variant {ctx.variant!r} (main, job<N> or jobs)")


def run_main(ctx) -> results.Result:
    cfg = ctx.settings
    devices = ctx.devices()
    kind = devices[0].kind
    divide.one_thread_per_cpu_device(kind)
    ran, not_applicable = divide.variants_for(kind, cfg.variants)
    log.info("kernels: %d %s device(s) (%s); variants %s", len(devices), kind, devices[0].name, ran)
    div_df = bench.run_divide(devices[0], cfg)
    split_df, phases_df = split.run_split(devices, cfg)
    r = ctx.new_result(kind, devices=[d.as_dict() for d in devices], device_name=devices[0].name,
                       n_devices=len(devices), variants_not_applicable=not_applicable,
                       split_kernel=divide.kernel_for(kind, cfg.kernel),
                       note=_note(kind, len(devices), not_applicable))
    r.add_table("divide", div_df, units=outcomes.units_for(div_df, bench.DIVIDE_NOTES))
    r.add_table("split", split_df, units=outcomes.units_for(split_df, split.SPLIT_NOTES))
    r.add_table("split_phases", phases_df, units=outcomes.units_for(phases_df))
    bar_list, physical = _bars_and_physical(kind, devices[0].name, len(devices), div_df, split_df)
    bar_df = outcomes.bars_frame(bar_list)
    r.add_table(outcomes.BARS, bar_df, units=outcomes.units_for(bar_df))
    output = bars.output_checks(div_df, split_df)
    r.add_table(outcomes.CHECKS, outcomes.checks_frame(output + physical))
    checks = outcomes.checks_frame(output)  # a wrong output stops the stage; a physical-limit
    # failure is a failed check in the result, not a crash
    na = [outcomes.NotApplicable(f"divide variant {v}", f"not applicable on {kind}"
                                 + (" (CuPy RawKernels need CUDA)" if kind == "cpu" else ""))
          for v in not_applicable]
    if len(devices) == 1:
        na.append(outcomes.NotApplicable("multi-device split comparisons", "one device"))
    r.add_table(outcomes.NOT_APPLICABLE, outcomes.not_applicable_frame(na))
    bad = checks[checks.verdict == outcomes.Verdict.FAIL.value]
    if len(bad):
        raise RuntimeError("kernels: output did not match numpy: " + "; ".join(bad["case"]))
    return r


def _note(kind: str, n: int, na: list[str]) -> str:
    parts = []
    if na:
        parts.append(f"not applicable on {kind}: {', '.join(na)}"
                     + (" (CuPy RawKernels need CUDA)" if kind == "cpu" else ""))
    if n == 1:
        parts.append("one device: the multi-device split comparisons are not applicable")
    return "; ".join(parts)


def _bars_and_physical(kind: str, name: str, n: int, div_df: pd.DataFrame, split_df: pd.DataFrame):
    return bars.physical_checks(kind, name, div_df,
                                bars.divide_bars(kind, name, div_df) + bars.split_bars(kind, n, split_df))


def main_bars(kind: str, name: str, n: int, div_df: pd.DataFrame, split_df: pd.DataFrame):
    return outcomes.bars_frame(_bars_and_physical(kind, name, n, div_df, split_df)[0])
