"""Collectives: the library's collectives and hand-written all-reduces, one process per device.

Each variant (see :mod:`gpulab.collectives.variants`) is one torchrun launch of
:mod:`gpulab.collectives.worker` over all the job's devices: NCCL on GPUs, gloo on CPU virtual
devices. Every case is checked exactly on every rank before it is timed; the tables are
``library``, ``allreduce_algorithms`` (default variant), ``samples``, ``coverage`` and ``bars``.
"""
from __future__ import annotations

import json
import logging

import pandas as pd

from gpulab import config, launch
from gpulab.collectives import assemble, formulas, library, nccltests
from gpulab.collectives import variants as variantmod

log = logging.getLogger("gpulab.collectives")
WORKER = "gpulab.collectives.worker"
SCHEMA = config.REPO_ROOT / "workflow" / "schemas" / "collectives.schema.yaml"


def stage_config(section: dict) -> dict:
    """The stage's config section validated, with the schema's defaults filled in (a script run by
    hand with a partial --config-json gets the same values as Snakemake's)."""
    return config.validate(dict(section), SCHEMA)


def coverage(variant: variantmod.Variant, ops: list[str], applicable: bool) -> pd.DataFrame:
    """Which (collective, mode) pairs this result holds, and why the others are missing."""
    rows = []
    for op in formulas.OPS:
        for mode in library.MODES:
            if not applicable:
                status = f"not applicable: {variant.note} is an NCCL setting (this run used gloo)"
            elif (op, mode) in library.UNSUPPORTED:
                status = f"not measured: {library.UNSUPPORTED[(op, mode)]}"
            elif op not in variant.ops:
                status = f"not measured in this variant: {variant.note}"
            elif op not in ops:
                status = "not measured: left out by config collectives.ops"
            else:
                status = "measured"
            rows.append({"op": op, "mode": mode, "status": status})
    return pd.DataFrame(rows)


def variant_table(configured: list[str], current: str, kind: str) -> pd.DataFrame:
    """The configured path variants and where each one's results are (NCCL-only ones are not
    applicable where the ranks run gloo on CPU, so the workflow runs only the default there)."""
    rows = []
    for name in configured:
        v = variantmod.get(name)
        if v.name == current:
            status = "this result"
        elif v.gpu_only and kind != "cuda":
            status = "not applicable: NCCL setting, this host ran gloo on CPU virtual devices"
        else:
            status = f"separate result ({v.name}.h5)"
        rows.append({"variant": v.name, "env": " ".join(f"{k}={x}" for k, x in v.env.items()),
                     "note": v.note, "status": status})
    return pd.DataFrame(rows)


def payload_for(cfg: dict, variant: variantmod.Variant, backend: str) -> dict:
    return {
        "backend": backend,
        "ops": [op for op in cfg["ops"] if op in variant.ops],
        "modes": list(library.MODES),
        "sizes_bytes": [int(s) for s in cfg["sizes_bytes"]],
        "algorithms": list(cfg["algorithms"]) if variant.handwritten else [],
        "warmup": int(cfg["warmup"]), "repeats": int(cfg["repeats"]), "iters": int(cfg["iters"]),
        "seed": int(cfg["seed"]), "slice_bytes": int(cfg["slice_bytes"]),
        "max_slices": int(cfg["max_slices"]),
    }


def nccl_reference(cfg: dict, kind: str, n: int, size: int,
                   node: launch.NodeSpec) -> tuple[float | None, str, dict]:
    """busbw of nccl-tests' in-place all-reduce at ``size`` when it can and should be run."""
    if kind != "cuda" or n < 2:
        return None, "", {}
    if node.nnodes > 1:
        return None, "nccl-tests reference not run: multi-node jobs need its MPI build", {}
    exe = nccltests.find(cfg.get("nccl_tests_bin"))
    if exe is None:
        return None, "nccl-tests all_reduce_perf not available (not on PATH)", {}
    row = nccltests.run(exe, n, size)
    return row["ip_busbw_GBps"], f"reference measured by {exe} in the same job", row


def run(ctx) -> "results.Result":  # noqa: F821 - gpulab.results.Result
    cfg = stage_config(ctx.config)
    variant = variantmod.get(ctx.variant)
    devices = ctx.devices()
    kind, n = devices[0].kind, len(devices)
    applicable = kind == "cuda" or not variant.gpu_only
    env = dict(variant.env) if kind == "cuda" else {}
    result = ctx.new_result(kind, world_size=n, variant_note=variant.note, applicable=applicable,
                            env=json.dumps({**launch.SAFE_ENV, **env}), dtype="float32",
                            devices=json.dumps([d.name for d in devices]),
                            conventions="algbw = S/t, busbw = algbw * factor (nccl-tests): "
                                        "all-reduce 2(n-1)/n, all-gather/reduce-scatter/all-to-all "
                                        "(n-1)/n, broadcast 1; t = slowest rank's per-call time")
    result.add_table("coverage", coverage(variant, cfg["ops"], applicable))
    if variant.name == "default":
        result.add_table("variants", variant_table(cfg["variants"], variant.name, kind))
    if not applicable:
        log.info("collectives/%s: not applicable on %s (%s)", variant.name, kind, variant.note)
        result.attrs["verified"] = True
        result.attrs["note"] = f"{variant.note}: NCCL only, not applicable to gloo on CPU"
        return result
    payload = payload_for(cfg, variant, "nccl" if kind == "cuda" else "gloo")
    log.info("collectives/%s: %d %s rank(s), env %s", variant.name, n, payload["backend"], env)
    node = launch.NodeSpec.from_config(ctx.devices_config.get("nodes"))
    ranks = launch.run_workers(WORKER, payload, n, node=node, env=env,
                               timeout=float(cfg["timeout_s"]))
    local = len(ranks) // max(1, node.nnodes)
    n = len(ranks)
    result.attrs.update({"world_size": n, "nnodes": node.nnodes, "node_rank": node.node_rank,
                         "local_ranks": local})
    launch.record_placement(result, ranks)
    result.attrs["backend"] = ranks[0]["backend"]
    result.attrs["device_name"] = ranks[0]["device_name"]
    merged = assemble.merge_ranks(ranks)
    tabs = assemble.tables(merged)
    for name, df in tabs.items():
        result.add_table(name, df, units=assemble.SAMPLE_UNITS if name == "samples"
                         else assemble.UNITS)
    wrong = sum(r["wrong"] for r in merged)
    result.attrs["verified"] = wrong == 0
    result.attrs["wrong_elements"] = wrong
    if "allreduce_algorithms" in tabs:
        algs = tabs["allreduce_algorithms"]
        ref, note, raw = nccl_reference(cfg, kind, n, int(algs["bytes"].max()), node)
        if raw:
            result.attrs["nccl_tests"] = json.dumps(raw)
        result.add_table("bars", assemble.bars(algs, kind, n, ref, note),
                         units={"measured": "GB/s", "reference": "GB/s", "ratio": "1"})
    if wrong:  # recorded (verified=False, per-case 'wrong' column) and shown by the report
        bad = [(r["op"], r["mode"], r["bytes"], r["wrong"]) for r in merged if r["wrong"]]
        log.error("collectives/%s: WRONG RESULTS (op, mode, bytes, wrong elements): %s",
                  variant.name, bad)
    return result

