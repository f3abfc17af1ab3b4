"""The gemm stage: single-device baseline, the bar, the multi-device sweep, strong scaling."""
from __future__ import annotations

import gc
import logging
import os

import pandas as pd
import torch

from gpulab import launch
from gpulab.gemm import numerics, scaling, single
from gpulab.stage import StageContext

log = logging.getLogger("gpulab.gemm")

WORKER = "gpulab.gemm.worker"
P2P_OFF_ENV = {"NCCL_P2P_DISABLE": "1"}  # NCCL then stages through host memory (SHM) over PCIe

TIME_UNITS = {f"time_s_{s}": "s" for s in ("median", "min", "max", "mean", "stdev")}
ROW_UNITS = {"M": "elements", "N": "elements", "K": "elements", **TIME_UNITS, "repeats": "count",
             "tflops_median": "TFLOP/s", "tflops_min": "TFLOP/s", "tflops_max": "TFLOP/s",
             "rel_error": "1 (relative Frobenius)", "bound": "1 (relative Frobenius)"}
MULTI_UNITS = {**ROW_UNITS, "P": "devices", "panels": "count", "compute_s": "s", "comm_s": "s"}
BAR_UNITS = {"measured": "TFLOP/s", "reference": "TFLOP/s", "ratio": "1", "threshold": "1"}


def check_config(cfg: dict) -> None:
    """Errors that the schema cannot express, named by key."""
    for i, size in enumerate(cfg["sizes"]):
        if len(size) != 3 or any(int(v) < 1 for v in size):
            raise ValueError(f"gemm.sizes[{i}] must be [M, N, K] with positive integers, got {size}")
    unknown = set(cfg["algorithms"]) - {"row1d", "summa", "summa_overlap"}
    if unknown:
        raise ValueError(f"gemm.algorithms: unknown {sorted(unknown)}")
    for p in cfg["ranks"]:
        if int(p) < 1:
            raise ValueError(f"gemm.ranks must be positive, got {p}")


def supported(cfg: dict, device: torch.device) -> tuple[list[numerics.Precision], list[dict]]:
    precs, coverage = [], []
    for name in cfg["dtypes"]:
        prec = numerics.precision(name)
        why = numerics.unsupported_reason(prec, device)
        coverage.append({"item": f"dtype {name}", "status": "not applicable" if why else "measured",
                         "reason": why or ""})
        if not why:
            precs.append(prec)
    return precs, coverage


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_multi(cfg: dict, precs, kind: str, world: int, threads: int | None, transport: str,
              ranks: list[int], env: dict | None = None, node: launch.NodeSpec = launch.NodeSpec(),
              result=None) -> list[dict]:
    payload = {
        "backend": "nccl" if kind == "cuda" else "gloo", "transport": transport,
        "sizes": cfg["sizes"], "dtypes": [p.name for p in precs], "algorithms": cfg["algorithms"],
        "ranks": ranks, "summa_panels": cfg["summa_panels"], "warmup": cfg["warmup"],
        "repeats": cfg["repeats"], "seed": cfg["seed"], "threads": threads or 1,
    }
    env = dict(env or {})
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    log.info("gemm: %s on %d rank(s), P in %s", transport, world, ranks)
    out = launch.run_workers(WORKER, payload, nproc=world // node.nnodes, env=env, node=node)
    if result is not None:
        launch.record_placement(result, out)
    return out[0]["rows"]


def run(ctx: StageContext):
    cfg = ctx.config
    check_config(cfg)
    devices = ctx.devices()
    kind, dev0, n_dev = devices[0].kind, devices[0].torch_device, len(devices)
    # A CPU virtual device is its share of the cores; the baseline gets the same share.
    threads = max(1, (os.cpu_count() or 1) // n_dev) if kind == "cpu" else None
    precs, coverage = supported(cfg, dev0)
    result = ctx.new_result(kind, device_name=devices[0].name, n_devices=n_dev,
                            threads_per_device=threads or 0)

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        single_rows = single.baseline(dev0, cfg["sizes"], precs, cfg["warmup"], cfg["repeats"],
                                      cfg["seed"])
        bars = [single.bar_row(dev0, cfg["bar_size"], cfg["warmup"], cfg["repeats"], cfg["seed"])]
    finally:
        torch.set_num_threads(before)
    _free(dev0)  # the workers need the GPU memory the baseline held

    ranks = sorted({int(p) for p in cfg["ranks"]})
    node = launch.NodeSpec.from_config(ctx.devices_config.get("nodes"))
    n_all = n_dev * node.nnodes
    # Several nodes: one rank per device on every node, so the launch spans them all.
    world = n_all if node.nnodes > 1 else min(n_dev, max(ranks))
    runnable = [p for p in ranks if p <= world]
    transport = "nccl" if kind == "cuda" else "gloo"
    multi_rows = run_multi(cfg, precs, kind, world, threads, transport, runnable, node=node,
                           result=result) if runnable else []
    for p in ranks:
        if p > n_all:
            coverage.append({"item": f"P={p}", "status": "not applicable",
                             "reason": f"{n_all} {kind} device(s) available"})
    if kind == "cuda" and world > 1 and cfg["p2p_off"]:
        multi_rows += run_multi(cfg, precs, kind, world, None, "nccl_p2p_off", [world], P2P_OFF_ENV,
                                node=node)
        coverage.append({"item": "NCCL P2P disabled", "status": "measured",
                         "reason": f"P={world}, NCCL_P2P_DISABLE=1"})
    else:
        why = ("needs CUDA GPUs (NCCL)" if kind != "cuda" else
               "needs >= 2 GPUs" if world < 2 else "disabled in config (gemm.p2p_off)")
        coverage.append({"item": "NCCL P2P disabled", "status": "not applicable", "reason": why})

    single_df, multi_df = pd.DataFrame(single_rows), pd.DataFrame(multi_rows)
    result.add_table("single", single_df, ROW_UNITS)
    result.add_table("multi", multi_df, MULTI_UNITS)
    result.add_table("scaling", scaling.table(single_df, multi_df, ranks, n_all), scaling.UNITS)
    result.add_table("bars", pd.DataFrame(bars), BAR_UNITS)
    result.add_table("coverage", pd.DataFrame(coverage))
    checks = [bool(v) for df in (single_df, multi_df) if "passed" in df for v in df["passed"]]
    result.attrs.update(checks_total=len(checks), checks_passed=sum(checks),
                        all_checks_passed=all(checks), world_size=world,
                        error_bounds={p.name: p.bound for p in numerics.PRECISIONS.values()})
    if not all(checks):
        log.error("gemm: %d of %d results exceed their error bound (see tables single/multi)",
                  len(checks) - sum(checks), len(checks))
    return result
