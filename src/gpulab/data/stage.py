"""The data stage job: write every dataset in every format, benchmark every loader, check round trips.

The data files go to ``--files-dir`` (default ``<out folder>/files``), built in a temporary folder
and moved into place only when everything succeeded: a failed job leaves no partial output.
CPU-only: loading is host work (host->device copies are measured by the transfer stage).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

import pandas as pd

from gpulab import outcomes, results
from gpulab.data import bench, formats, loaders
from gpulab.data.errors import DataError
from gpulab.outcomes import NotApplicable, Verdict
from gpulab.stage import StageContext, progress

log = logging.getLogger("gpulab.data")

CONVENTIONS = ("MB = 10^6 B; file MB/s = file size on disk / median load time; rows/s = samples / "
               "median load time; load = file -> validated torch tensors (x float32, y int64); "
               "warm OS page cache (files read right after writing); time to first batch = first "
               "batch_rows samples as tensors (whole-file loaders: their full load); peak memory = "
               "rise of the resident high-water mark during one load")


def files_dir(ctx: StageContext) -> Path:
    return Path(ctx.extra.get("files_dir") or ctx.out.parent / "files")


def cache_dir(ctx: StageContext) -> Path:
    """The dataset cache: ``--cache-dir``, else ``cache/`` beside the host folders (the job's
    ``results/data/<host>/main.h5`` -> ``results/data/cache/``), shared by hosts and runs."""
    return Path(ctx.extra.get("cache_dir") or ctx.out.parent.parent / "cache")


@contextlib.contextmanager
def staging(final: Path):
    """A fresh temporary folder beside ``final``; it replaces ``final`` only on success."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(ctx: StageContext) -> results.Result:
    cfg = ctx.settings
    inputs = loaders.external_inputs(cfg)
    todo = bench.cases(cfg, cache_dir(ctx))
    loads, writes, checks = [], [], []
    with staging(files_dir(ctx)) as folder:
        jobs = [(c, f) for c in todo for f in bench.formats_for(c, cfg)]
        for case, fmt in progress(jobs, "data: write + load"):
            path, wrow = bench.write_case(case, fmt, folder, cfg)
            writes.append(wrow)
            for (f, method) in loaders.LOADERS:
                if f == fmt:
                    row, check = bench.load_case(case, case.data.name, case.kind, path, fmt,
                                                 method, formats.Schema.of(case.data), cfg)
                    loads.append(row)
                    checks.append(check)
        for path, fmt, schema in inputs:
            for (f, method) in loaders.LOADERS:
                if f == fmt:
                    row, check = bench.load_case(None, path.name, "external", path, fmt, method,
                                                 schema, cfg)
                    loads.append(row)
                    checks.append(check)
        bad = [c for c in checks if c.verdict == Verdict.FAIL.value]
        if bad:  # a loader that returns wrong data is a bug: fail the job, keep nothing
            raise DataError(folder, "round trip failed: " + "; ".join(
                f"{c.case}: {c.note}" for c in bad))

    r = ctx.new_result("cpu", conventions=CONVENTIONS, files_dir=str(files_dir(ctx)),
                       batch_rows=cfg.batch_rows)
    loads_df, writes_df = pd.DataFrame(loads), pd.DataFrame(writes)
    r.add_table("loads", loads_df, units=outcomes.units_for(loads_df))
    r.add_table("writes", writes_df, units=outcomes.units_for(writes_df))
    r.add_table(outcomes.CHECKS, outcomes.checks_frame(checks))
    external = [c for c in checks if c.verdict == Verdict.NOT_APPLICABLE.value]
    r.add_table(outcomes.NOT_APPLICABLE, outcomes.not_applicable_frame(
        [NotApplicable(f"round trip of {c.case}", c.note) for c in external]))
    datasets = pd.DataFrame([
        {"dataset": c.data.name, "kind": c.kind, "rows": c.data.rows,
         "sample_shape": "x".join(map(str, c.data.sample_shape)),
         "classes": c.data.meta["num_classes"], "source": c.data.meta.get("source", ""),
         "tensor_bytes": c.data.nbytes, "from_cache": c.cached} for c in todo])
    r.add_table("datasets", datasets, units=outcomes.units_for(datasets))
    log.info("data: %d loads timed, %d round-trip checks passed", len(loads), len(checks))
    return r


def _extra_args(ap) -> None:
    ap.add_argument("--files-dir", type=Path, default=None,
                    help="folder for the data files written (default: <out folder>/files)")


def main(doc: str | None = None, argv: list[str] | None = None) -> int:
    """scripts/data.py: bad input ends the job with one clear line (file, line/key, problem)."""
    import sys

    from gpulab.stage import stage_main

    try:
        return stage_main("data", run, doc, argv, extra_args=_extra_args)
    except DataError as exc:
        log.error("data: %s", exc)
        print(f"data: error: {exc}", file=sys.stderr)
        return 1
