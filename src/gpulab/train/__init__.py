"""Training sweeps (issue 9): data parallel, DDP, naive model parallel, pipeline and tensor
parallel, with the seed's techniques, on CUDA GPUs or CPU virtual devices (gloo ranks).

Variants (one result file each): ``single`` (one process: single device, DataParallel, naive
model parallel, freezing, offloading), ``ddp``, ``pipeline`` and ``tensor`` (torchrun ranks).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

import pandas as pd

from gpulab import config as cfgmod
from gpulab import launch, outcomes, phases
from gpulab.outcomes import Bar, Check
from gpulab.stage import StageContext
from gpulab.train import tables
from gpulab.train.settings import Settings

log = logging.getLogger("gpulab.train")
VARIANTS = ("single", "ddp", "pipeline", "tensor")
WORKER = "gpulab.train.worker"


def check_config(section: Mapping) -> None:
    """The cross-key rules a schema cannot say, on the validated section: the registry's
    config_check hook, run when the workflow is parsed (and for a script run by hand)."""
    cfg = Settings.from_section(section)
    bad = [m for m in cfg.microbatches if cfg.pipeline_batch % m]
    if bad:
        raise cfgmod.ConfigError(f"train.pipeline_batch={cfg.pipeline_batch} is not divisible "
                                 f"by train.microbatches {bad}")
    g = cfg.gpt
    if g.d_model % g.n_heads:
        raise cfgmod.ConfigError(f"train.gpt.d_model={g.d_model} is not a multiple of "
                                 f"train.gpt.n_heads={g.n_heads}")


def parallel_degree(variant: str, cfg: Settings, n: int) -> tuple[int, str]:
    """Ranks a model-parallel variant can use on ``n`` devices, and why it uses fewer.

    Tensor parallel splits attention heads (and the 4 x d_model MLP) evenly: the largest divisor of
    n_heads that is <= n. Pipeline parallel needs a layer per stage: at most n_layers + 2 stages
    (embedding, blocks, head).
    """
    g = cfg.gpt
    if variant == "tensor":
        d = max(k for k in range(1, n + 1) if g.n_heads % k == 0)
        why = f"n_heads={g.n_heads} splits evenly over {d} of the {n} devices"
    else:
        d = min(n, g.n_layers + 2)
        why = f"TinyGPT has {g.n_layers + 2} layers: at most {d} pipeline stages on {n} devices"
    return d, ("" if d == n else why)


def run(ctx: StageContext):
    if ctx.variant not in VARIANTS:
        raise SystemExit(f"train: unknown variant {ctx.variant!r} (known: {', '.join(VARIANTS)})")
    cfg = ctx.settings
    devices = ctx.devices()
    kind, n = devices[0].kind, len(devices)
    res = ctx.new_result(kind, n_devices=n, device_names=[d.name for d in devices],
                         dataset=str(ctx.extra.get("data") or ""))
    checks: list[Check] = []
    bars: list[Bar] = []
    try:
        if ctx.variant == "single":
            from gpulab.train import single

            # nn.DataParallel runs NCCL in this process: it gets the workers' environment.
            launch.apply_safe_env(ctx.devices_config)
            digits = _digits(ctx)
            with phases.phase("single-process sweep"):
                out = single.run_single(cfg, digits, devices)
            _add(res, "throughput", out["throughput"])
            _add(res, "loss_curve", out["loss_curve"])
            checks += out["checks"]
            # After the timed sweep, on fresh models: the energy steps share no state with it.
            from gpulab.train import energy

            with phases.phase("energy of a training step"):
                energy.add_table(res, cfg, digits, devices[0].torch_device)
            if kind == "cpu":
                res.attrs["data_parallel_note"] = single.DP_CPU_NOTE
        elif ctx.variant == "ddp":
            ranks = _launch(ctx, "ddp", cfg, n)
            launch.record_placement(res, ranks)
            agg = tables.ddp_table([r for rk in ranks for r in rk["rows"]])
            res.add_table("ddp", agg, units=outcomes.units_for(agg))
            _add(res, "ddp_ranks", [r for rk in ranks for r in rk["rows"]])
            _add(res, "lr_scaling", ranks[0]["curves"])
            checks += [Check(**c) for c in ranks[0]["checks"]]
            bars += tables.ddp_bars(agg, kind, n, cfg.models[0])
        else:
            bars += _model_parallel(ctx, res, cfg, kind, n, checks)
    except launch.LaunchError as exc:
        log.error("train/%s: the launch failed: %s", ctx.variant, exc)
        checks.append(Check.crashed(f"{ctx.variant} launch on {n} rank(s)", exc))
    res.add_table("checks", outcomes.checks_frame(checks))
    res.add_table("bars", outcomes.bars_frame(bars))
    res.attrs["backend"] = "nccl" if kind == "cuda" else "gloo"
    return res


def _model_parallel(ctx, res, cfg, kind, n, checks: list) -> list[Bar]:
    """Pipeline / tensor parallel. On one device there is nothing to split: the variant still runs
    (one stage / a mesh of one) to exercise the code path, and its bars say 'not applicable'."""
    used, why = parallel_degree(ctx.variant, cfg, n)
    if why:
        log.info("train/%s: %d of %d devices (%s)", ctx.variant, used, n, why)
        res.add_table(outcomes.NOT_APPLICABLE, outcomes.not_applicable_frame(
            [outcomes.NotApplicable(f"{ctx.variant} parallel over all {n} devices", why)]))
    res.attrs["parallel_degree"] = used
    ranks = _launch(ctx, ctx.variant, cfg, used)
    launch.record_placement(res, ranks)
    rows = [r for rk in ranks for r in rk["rows"]]
    if ctx.variant == "pipeline":
        agg, rows_checked, bars = tables.pipeline_tables(rows, cfg, kind, used)
        _add(res, "pipeline_ranks", rows)
    else:
        agg, rows_checked, bars = tables.tensor_tables(rows, [rk["checks"] for rk in ranks], cfg,
                                                       kind, used)
    res.add_table(ctx.variant, agg, units=outcomes.units_for(agg))
    checks += rows_checked
    return bars


def _launch(ctx, mode, cfg, n) -> list[dict]:
    payload = {"mode": mode, "cfg": cfg.as_section(), "data": str(ctx.extra.get("data") or ""),
               "backend": "auto"}
    if mode == "ddp":
        _digits(ctx)  # fail early, in this process, on a missing or bad training set
    node = launch.NodeSpec.from_config(ctx.devices_config["nodes"])
    log.info("train/%s: %d rank(s) on node %d of %d", mode, n, node.node_rank, node.nnodes)
    # Multi-node: the ranks of every node, gathered on node 0, which alone writes the result.
    # The ranks' own start-up (torchrun, imports, process groups) is inside this phase.
    with phases.phase(f"{mode} ranks (launch and run)"):
        return launch.run_workers(WORKER, payload, nproc=n, node=node,
                                  multicast=launch.multicast_allowed(ctx.devices_config))


def _digits(ctx):
    from gpulab.train import data

    path = ctx.extra.get("data")
    if not path:
        raise SystemExit("train: --data <digits.h5> is required for this variant")
    with phases.phase("training set load", phases.SETUP):
        return data.open_digits(Path(path))


def _add(res, name: str, rows: list[dict]):
    df = pd.DataFrame(rows)
    res.add_table(name, df, units=outcomes.units_for(df))
