"""The gemm stage: single-device baseline, the bar, the multi-device sweep, strong scaling."""
from __future__ import annotations

import gc
import logging
import os

import pandas as pd
import torch

from gpulab import launch, outcomes, plausible
from gpulab.gemm import energy, numerics, scaling, single
from gpulab.gemm.settings import Settings
from gpulab.outcomes import Check, NotApplicable, Verdict
from gpulab.stage import StageContext

log = logging.getLogger("gpulab.gemm")

WORKER = "gpulab.gemm.worker"
P2P_OFF_ENV = {"NCCL_P2P_DISABLE": "1"}  # NCCL then stages through host memory (SHM) over PCIe


def supported(dtypes, device: torch.device) -> tuple[list[numerics.Precision], list[NotApplicable]]:
    precs, skipped = [], []
    for name in dtypes:
        prec = numerics.precision(name)
        why = numerics.unsupported_reason(prec, device)
        if why:
            skipped.append(NotApplicable(f"dtype {name}", why))
        else:
            precs.append(prec)
    return precs, skipped


def _per_device(cfg: Settings, devices, kind: str, dev0, skipped: list) -> list[dict]:
    """The health figure (gemm.per_device, gpulab.gemm.perdevice): every GPU at steady clocks; on
    CPU the CPU once. Off (no rows) while per_device.size is 0."""
    from gpulab.gemm import perdevice

    pc, gpu = cfg.per_device, kind == "cuda"
    size = pc.size if gpu else pc.cpu_size
    if size <= 0:
        return []
    precs, why = supported(pc.dtypes if gpu else pc.cpu_dtypes, dev0)
    skipped += [NotApplicable(f"per-device GEMM {n.what}", n.reason) for n in why]
    devs = [d.torch_device for d in devices] if gpu else [dev0]
    seconds = pc.seconds if gpu else pc.cpu_seconds
    warm = pc.warmup_max_s if gpu else pc.cpu_warmup_max_s
    return perdevice.measure(devs, size, precs, seconds, cfg.repeats, warm, cfg.seed)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_multi(cfg: Settings, precs, kind: str, nproc: int, threads: int | None, transport: str,
              ranks: list[int], env: dict | None = None,
              node: launch.NodeSpec = launch.NodeSpec(), multicast: bool = False,
              result=None) -> list[dict]:
    """Rows of one launch: ``nproc`` ranks on each of ``node.nnodes`` nodes."""
    payload = {
        "backend": "nccl" if kind == "cuda" else "gloo", "transport": transport,
        "sizes": cfg.sizes, "dtypes": [p.name for p in precs], "algorithms": cfg.algorithms,
        "ranks": ranks, "summa_panels": cfg.summa_panels, "warmup": cfg.warmup,
        "repeats": cfg.repeats, "seed": cfg.seed, "threads": threads or 1,
    }
    env = dict(env or {})
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    log.info("gemm: %s on %d rank(s) x %d node(s), P in %s", transport, nproc, node.nnodes, ranks)
    out = launch.run_workers(WORKER, payload, nproc=nproc, env=env, node=node, multicast=multicast)
    if result is not None:
        launch.record_placement(result, out)
    # Global rank 0 holds every row; the other ranks return none.
    return [row for rank in out for row in rank["rows"]]


def run(ctx: StageContext):
    cfg = ctx.settings
    devices = ctx.devices()
    kind, dev0, n_dev = devices[0].kind, devices[0].torch_device, len(devices)
    node = launch.NodeSpec.from_config(ctx.devices_config["nodes"])
    multicast = launch.multicast_allowed(ctx.devices_config)
    # A CPU virtual device is its share of the cores; the baseline gets the same share.
    threads = max(1, (os.cpu_count() or 1) // n_dev) if kind == "cpu" else None
    precs, skipped = supported(cfg.dtypes, dev0)
    ranks = sorted(set(cfg.ranks))
    nproc = min(n_dev, max(ranks, default=1))  # ranks on this node; every node runs as many
    world = nproc * node.nnodes
    result = ctx.new_result(kind, device_name=devices[0].name, n_devices=n_dev,
                            threads_per_device=threads or 0, world_size=world,
                            nnodes=node.nnodes, node_rank=node.node_rank,
                            error_bounds={p.name: p.bound for p in numerics.PRECISIONS.values()})

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        single_rows = single.baseline(dev0, cfg.sizes, precs, cfg.warmup, cfg.repeats,
                                      cfg.seed)
        bars, checks = single.peak_bars(dev0, devices[0].name, cfg.bar_size, precs,
                                        cfg.warmup, cfg.repeats, cfg.seed)
        energy_rows = energy.bf16_rows(dev0, cfg.bar_size, cfg.seed, precs)
        if kind == "cuda":
            checks.append(single.harness_check(dev0, cfg.bar_size, cfg.warmup,
                                               cfg.repeats, cfg.seed))
        else:
            skipped.append(NotApplicable(single.HARNESS_CHECK, single.HARNESS_CPU_REASON))
        per_gpu_rows = _per_device(cfg, devices, kind, dev0, skipped)
    finally:
        torch.set_num_threads(before)
    _free(dev0)  # the workers need the GPU memory the baseline held

    runnable = [p for p in ranks if p <= world]
    transport = "nccl" if kind == "cuda" else "gloo"
    multi_rows = []
    if not ranks:
        skipped.append(NotApplicable("multi-device GEMM", "gemm.ranks is empty: the single-device "
                                     "baseline only"))
    if runnable:
        try:
            multi_rows = run_multi(cfg, precs, kind, nproc, threads, transport, runnable, node=node,
                                   multicast=multicast, result=result)
        except launch.LaunchError as exc:
            log.error("gemm: the multi-device launch failed: %s", exc)
            checks.append(Check.crashed(f"{transport} launch, P in {runnable}", exc))
    for p in ranks:
        if p > world:
            skipped.append(NotApplicable(f"P={p}", f"{world} {kind} device(s) in this job"))
    if kind == "cuda" and nproc > 1 and node.nnodes == 1 and cfg.p2p_off:
        try:
            multi_rows += run_multi(cfg, precs, kind, nproc, None, "nccl_p2p_off", [nproc],
                                    P2P_OFF_ENV, multicast=multicast)
        except launch.LaunchError as exc:
            checks.append(Check.crashed(f"nccl_p2p_off launch, P={nproc}", exc))
    else:
        why = ("gemm.ranks is empty" if not ranks else
               "needs CUDA GPUs (NCCL)" if kind != "cuda" else
               "needs >= 2 GPUs on one node" if nproc < 2 else
               "a one-node setting (NCCL_P2P_DISABLE between the GPUs of a node)"
               if node.nnodes > 1 else "disabled in config (gemm.p2p_off)")
        skipped.append(NotApplicable("NCCL P2P disabled", why))

    single_df, multi_df = pd.DataFrame(single_rows), pd.DataFrame(multi_rows)
    checks = [single.error_check(r, "single") for r in single_rows] + [
        single.error_check(r, f"{r['algorithm']} P={r['P']} {r['transport']}") for r in multi_rows
    ] + checks
    scal = scaling.table(single_df, multi_df)
    skipped += scaling.unmeasured(multi_df, runnable, world)
    bars, physical = plausible.guard_all(bars)  # every peak bar is against the dense peak
    checks += physical + single.plausibility_checks(single_rows, multi_rows, devices[0].name)
    bars += scaling.bars(scal, kind, world, ranks)
    tables = [("single", single_df), ("multi", multi_df), ("scaling", scal)]
    if per_gpu_rows:
        tables.append(("per_gpu", pd.DataFrame(per_gpu_rows)))
    for name, df in tables:
        result.add_table(name, df, outcomes.units_for(df))
    energy_df = pd.DataFrame(energy_rows, columns=energy.COLUMNS)
    result.add_table("energy", energy_df, outcomes.units_for(energy_df))
    result.add_table("bars", outcomes.bars_frame(bars))
    result.add_table("checks", outcomes.checks_frame(checks))
    result.add_table("not_applicable", outcomes.not_applicable_frame(skipped))
    failed = [c for c in checks if c.verdict == Verdict.FAIL]
    if failed:
        log.error("gemm: %d of %d checks failed: %s", len(failed), len(checks),
                  "; ".join(f"{c.check} [{c.case}]" for c in failed[:5]))
    return result
