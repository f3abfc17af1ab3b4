"""Collectives: the library's collectives and hand-written all-reduces, one process per device.

Each variant (see :mod:`gpulab.collectives.variants`) is one launch (gpulab.launch) of
:mod:`gpulab.collectives.worker` over all the job's devices: NCCL on GPUs, gloo on CPU virtual
devices. Every case is checked exactly on every rank before it is timed; the tables are
``library``, ``allreduce_algorithms`` (default variant), ``samples``, ``variants``, ``checks``,
``bars`` and ``not_applicable``.
"""
from __future__ import annotations

import json
import logging
import subprocess

import pandas as pd

from gpulab import launch, outcomes
from gpulab.collectives import assemble, formulas, library, nccltests
from gpulab.collectives import variants as variantmod
from gpulab.collectives.settings import Settings
from gpulab.outcomes import Check, NotApplicable, Verdict

log = logging.getLogger("gpulab.collectives")
WORKER = "gpulab.collectives.worker"


def not_measured(variant: variantmod.Variant, ops: list[str], applicable: bool) -> list[NotApplicable]:
    """The (collective, mode) pairs this result does not hold, and why."""
    rows = []
    for op in formulas.OPS:
        for mode in library.MODES:
            if not applicable:
                why = f"{variant.note} is an NCCL setting (this run used gloo)"
            elif (op, mode) in library.UNSUPPORTED:
                why = library.UNSUPPORTED[(op, mode)]
            elif op not in variant.ops:
                why = f"not measured in this variant: {variant.note}"
            elif op not in ops:
                why = "left out by config collectives.ops"
            else:
                continue
            rows.append(NotApplicable(f"{op} {mode}", why))
    return rows


def variant_table(configured: list[str], current: str,
                  kind: str) -> tuple[pd.DataFrame, list[NotApplicable]]:
    """The configured path variants and where each one's results are, and the variants that do
    not apply here as not_applicable rows with the reason (NCCL-only ones where the ranks run gloo
    on CPU, so the workflow runs only the default there)."""
    rows, skipped = [], []
    for name in configured:
        v = variantmod.get(name)
        env = " ".join(f"{k}={x}" for k, x in v.env.items())
        if v.name != current and v.gpu_only and kind != "cuda":
            skipped.append(NotApplicable(f"path variant {v.name} ({env or v.note})",
                                         "an NCCL setting; this host ran gloo on CPU virtual devices"))
            continue
        rows.append({"variant": v.name, "env": env, "note": v.note,
                     "result": "this result" if v.name == current else f"{v.name}.h5"})
    return pd.DataFrame(rows, columns=["variant", "env", "note", "result"]), skipped


def payload_for(cfg: Settings, variant: variantmod.Variant, backend: str) -> dict:
    return {
        "backend": backend,
        "ops": [op for op in cfg.ops if op in variant.ops],
        "modes": list(library.MODES),
        "sizes_bytes": list(cfg.sizes_bytes),
        "algorithms": list(cfg.algorithms) if variant.handwritten else [],
        "warmup": cfg.warmup, "repeats": cfg.repeats, "iters": cfg.iters,
        "seed": cfg.seed, "slice_bytes": cfg.slice_bytes,
        "max_slices": cfg.max_slices,
    }


def nccl_reference(cfg: Settings, kind: str, n: int, size: int, node: launch.NodeSpec,
                   multicast: bool = False) -> tuple[float | None, str, dict]:
    """busbw of nccl-tests' in-place all-reduce at ``size`` (median over as many cycles as gpulab
    has repetitions, as many calls per cycle as gpulab's iters) when it can and should be run."""
    if kind != "cuda" or n < 2:
        return None, "", {}
    if node.nnodes > 1:
        return None, "nccl-tests reference not run: multi-node jobs need its MPI build", {}
    exe = nccltests.find(cfg.nccl_tests_bin)
    if exe is None:
        return None, "nccl-tests all_reduce_perf not available (not on PATH)", {}
    rows = nccltests.run(exe, n, size, warmup=cfg.warmup, iters=cfg.iters,
                         cycles=cfg.repeats, multicast=multicast)
    ref = nccltests.reference(rows, n)
    return ref["ip_busbw_GBps"], f"{exe}, same job", ref


def _link_limit(ranks: list[dict], device_name: str, node: launch.NodeSpec):
    """The all-reduce's link limit from NVML, for the GPUs of this node (one node only)."""
    from gpulab import devices as devmod
    from gpulab import limits

    if node.nnodes > 1:
        return limits.Limit(None, "GB/s", "", "multi-node job: the network is the limit, and "
                                              "gpulab has no figure for it")
    bus = [r.get("bus_id") or "" for r in ranks]
    if not all(bus):
        return limits.Limit(None, "GB/s", "", "the ranks did not report their PCI bus ids")
    return assemble.link_limit(device_name, devmod.link_info(bus))


def run(ctx) -> "results.Result":  # noqa: F821 - gpulab.results.Result
    cfg = ctx.settings
    variant = variantmod.get(ctx.variant)
    devices = ctx.devices()
    kind, n = devices[0].kind, len(devices)
    applicable = kind == "cuda" or not variant.gpu_only
    multicast = launch.multicast_allowed(ctx.devices_config)
    env = dict(variant.env) if kind == "cuda" else {}
    result = ctx.new_result(kind, world_size=n, variant_note=variant.note, applicable=applicable,
                            env=json.dumps({**launch.safe_env(ctx.devices_config), **env}),
                            dtype="float32", devices=json.dumps([d.name for d in devices]),
                            conventions="algbw = S/t, busbw = algbw * factor (nccl-tests): "
                                        "all-reduce 2(n-1)/n, all-gather/reduce-scatter/all-to-all "
                                        "(n-1)/n, broadcast 1; t = slowest rank's per-call time")
    skipped = not_measured(variant, cfg.ops, applicable)
    if variant.name == "default":
        table, not_here = variant_table(cfg.variants, variant.name, kind)
        result.add_table("variants", table)
        skipped += not_here
    if not applicable:
        # Nothing was checked here: the result's verdict is not_applicable, never "verified".
        log.info("collectives/%s: not applicable on %s (%s)", variant.name, kind, variant.note)
        result.attrs["note"] = f"{variant.note}: NCCL only, not applicable to gloo on CPU"
        skipped.insert(0, NotApplicable(f"variant {variant.name}", result.attrs["note"]))
        result.add_table("not_applicable", outcomes.not_applicable_frame(skipped))
        return result
    payload = payload_for(cfg, variant, "nccl" if kind == "cuda" else "gloo")
    log.info("collectives/%s: %d %s rank(s), env %s", variant.name, n, payload["backend"], env)
    node = launch.NodeSpec.from_config(ctx.devices_config["nodes"])
    try:
        ranks = launch.run_workers(WORKER, payload, n, node=node, env=env,
                                   timeout=cfg.timeout_s, multicast=multicast)
    except launch.LaunchError as exc:
        log.error("collectives/%s: the launch failed: %s", variant.name, exc)
        result.add_table("checks", outcomes.checks_frame(
            [Check.crashed(f"{payload['backend']} launch, variant {variant.name}", exc)]))
        result.add_table("not_applicable", outcomes.not_applicable_frame(skipped))
        return result
    local = len(ranks) // max(1, node.nnodes)
    n = len(ranks)  # every node's ranks, gathered on global rank 0
    result.attrs.update({"world_size": n, "nnodes": node.nnodes, "node_rank": node.node_rank,
                         "local_ranks": local})
    launch.record_placement(result, ranks)
    result.attrs["backend"] = ranks[0]["backend"]
    result.attrs["device_name"] = ranks[0]["device_name"]
    merged = assemble.merge_ranks(ranks)
    tabs = assemble.tables(merged)
    for name, df in tabs.items():
        result.add_table(name, df, units=outcomes.units_for(df))
    checks = assemble.checks(merged, result.attrs["backend"])
    checks += assemble.plausibility_checks(tabs["library"], result.attrs["device_name"])
    # The bars are built from the library table whether or not hand-written algorithms ran (the
    # health preset runs none), issue 24.
    algs = tabs.get("allreduce_algorithms")
    if algs is None:
        algs = assemble.library_allreduce(tabs["library"])
    if len(algs):
        try:
            ref, note, raw = nccl_reference(cfg, kind, n, int(algs["bytes"].max()), node, multicast)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            checks.append(Check.crashed("nccl-tests all_reduce_perf", exc))
            ref, note, raw = None, f"nccl-tests all_reduce_perf failed: {exc}"[:300], {}
        if raw:
            result.attrs["nccl_tests"] = json.dumps(raw)
        link = _link_limit(ranks, result.attrs["device_name"], node) \
            if ref is None and kind == "cuda" and n > 1 else None
        result.add_table("bars", outcomes.bars_frame(assemble.bars(algs, kind, n, ref, note, link)))
    result.add_table("checks", outcomes.checks_frame(checks))
    result.add_table("not_applicable", outcomes.not_applicable_frame(skipped))
    wrong = [c for c in checks if c.verdict == Verdict.FAIL]
    if wrong:
        log.error("collectives/%s: WRONG RESULTS: %s", variant.name,
                  "; ".join(f"{c.case} ({c.value:g} wrong)" for c in wrong))
    return result
