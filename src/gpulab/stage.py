"""The one entry-point shape every stage script uses.

A rule calls ``python scripts/<stage>.py --payload <slice.json> --out <file.h5>`` (through
``gpulab-slot`` when it needs GPUs); by hand, ``--config-json '<slice>'`` does the same. This module
parses that, discovers devices, runs the stage's ``run(ctx)`` and writes the returned
:class:`~gpulab.results.Result` atomically.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from gpulab import devices as devmod
from gpulab import lifetime, phases, results
from gpulab.launch import NotResultNode

log = logging.getLogger("gpulab")


@dataclass
class StageContext:
    stage: str
    variant: str
    # This stage's section of config.yaml and the `devices` keys it reads (see StageSpec.payload),
    # both validated, defaults filled in (by the workflow, or by context_from_args for a script run
    # by hand). The section is recorded in the result as is; the stage reads `settings`.
    config: dict[str, Any]
    devices_config: dict[str, Any]
    out: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self):
        """The stage's frozen typed view of its section (its settings.py), built on first use."""
        if getattr(self, "_settings", None) is None:
            from gpulab import stages

            self._settings = stages.get(self.stage).settings_class().from_section(self.config)
        return self._settings

    def devices(self, limit: int | None = None) -> list[devmod.Device]:
        # Set-up: on a GPU host this is torch's CUDA initialisation.
        with phases.phase("device discovery", phases.SETUP):
            return devmod.discover(self.devices_config["backend"], self.devices_config["cpu_devices"],
                                   limit=limit)

    def new_result(self, device_kind: str, **attrs) -> results.Result:
        r = results.Result(self.stage, self.variant, self.config, device_kind)
        r.attrs.update(attrs)
        return r


def setup_logging(verbose: bool = False) -> None:
    # Rich only on a terminal: in a log file it wraps at 80 columns and splits "12.3 GB/s" over lines.
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    fmt = "%(asctime)s %(levelname)s %(message)s"
    if sys.stderr.isatty():
        try:
            from rich.logging import RichHandler

            handler, fmt = RichHandler(show_path=False, rich_tracebacks=False), "%(message)s"
        except ImportError:  # pragma: no cover - rich is a dependency
            pass
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=fmt,
                        handlers=[handler], force=True)


def progress(iterable: Iterable, description: str, total: int | None = None):
    """Progress bar on a terminal, plain log lines in Snakemake's logs."""
    items = list(iterable) if total is None else iterable
    total = len(items) if total is None else total
    if sys.stderr.isatty():
        from rich.progress import track

        yield from track(items, description=description, total=total)
        return
    for i, item in enumerate(items, 1):
        log.info("%s [%d/%d]", description, i, total)
        yield item


def parse_args(stage: str, doc: str | None, argv: list[str] | None = None,
               extra_args: Callable[[argparse.ArgumentParser], None] | None = None):
    ap = argparse.ArgumentParser(
        prog=f"scripts/{stage}.py", description=doc or f"gpulab {stage} stage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config-json", default="{}",
                    help="JSON object: {'stage': <this stage's config section>, 'devices': {...}}")
    ap.add_argument("--payload", type=Path, default=None,
                    help="JSON file holding the --config-json object (what Snakemake jobs pass)")
    ap.add_argument("--config-file", type=Path, nargs="*", default=None,
                    help="read and validate config YAML files instead of --config-json")
    ap.add_argument("--out", type=Path, required=True, help="result file to write (.h5)")
    ap.add_argument("--variant", default="main", help="variant name recorded in the result")
    ap.add_argument("-v", "--verbose", action="store_true")
    if extra_args:
        extra_args(ap)
    return ap.parse_args(argv)


def load_payload(config_json: str = "{}", payload: Path | None = None) -> dict:
    """The job's config payload: from the ``--payload`` file where given, else ``--config-json``."""
    try:
        return json.loads(payload.read_text() if payload else config_json)
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{payload or '--config-json'}: not a readable JSON payload: {exc}")


def validate_payload(stage: str, payload: dict) -> dict:
    """What the workflow does to the whole config when it is parsed, for a payload no workflow
    validated: its section and `devices` validated in place (defaults filled in), then the stage's
    config check (what the schema cannot state). Raises gpulab.config.ConfigError."""
    from gpulab import config as cfgmod
    from gpulab import stages

    cfgmod.validate_section(stage, payload.setdefault("stage", {}))
    payload["devices"] = cfgmod.validate_devices(payload.get("devices", {}))
    spec = stages.STAGES.get(stage)
    if spec and spec.config_check:
        stages.hook(spec.config_check)(payload["stage"])
    return payload


def context_from_args(stage: str, args) -> StageContext:
    from gpulab import config as cfgmod

    if args.config_file:
        full = cfgmod.load(args.config_file)
        payload = {"stage": full.get(stage, {}), "devices": full.get("devices", {}),
                   "validated": True}
    else:
        payload = load_payload(args.config_json, args.payload)
    # A Snakemake job's payload is a slice of a config already validated as a whole (defaults
    # filled in) at the workflow's entry point, and says so: validating it again would repeat the
    # same work for the same answer. A script run by hand has no such promise and validates its
    # section here, so both get the same defaults and the same named errors.
    if not payload.get("validated"):
        try:
            validate_payload(stage, payload)
        except cfgmod.ConfigError as exc:
            raise SystemExit(f"scripts/{stage}.py: {exc}")
    extra = {k: v for k, v in vars(args).items()
             if k not in ("config_json", "payload", "config_file", "out", "variant", "verbose")}
    return StageContext(stage, args.variant, payload.get("stage", {}), payload.get("devices", {}),
                        args.out, extra)


def _visible(ctx: StageContext) -> str:
    ids = os.environ.get("CUDA_VISIBLE_DEVICES")
    if ids is None:
        return "every GPU of the host"
    if ids.strip() and ctx.devices_config["backend"] != "cpu":
        return f"GPU {ids}"
    return f"no GPU; {ctx.devices_config['cpu_devices']} CPU virtual devices"


def stage_main(stage: str, run: Callable[[StageContext], results.Result], doc: str | None = None,
               argv: list[str] | None = None,
               extra_args: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    rec = phases.start(stage)
    age = phases.process_age()  # interpreter start to here: the imports of the stage's script
    args = parse_args(stage, doc, argv, extra_args)
    # A crash in native code (CUDA, NCCL, HDF5) then leaves a Python traceback in the job's log.
    with contextlib.suppress(OSError, ValueError):  # stderr without a file (pytest capture)
        faulthandler.enable()
    setup_logging(args.verbose)
    rec.record("start-up (interpreter start, imports)", age, phases.SETUP)
    ctx = context_from_args(stage, args)
    log.info("%s/%s: starting (devices visible: %s)", stage, ctx.variant,
             _visible(ctx))

    def run_and_write() -> int:
        t0, before = time.perf_counter(), len(rec.rows)
        try:
            result = run(ctx)
        except NotResultNode as exc:
            # A node of a multi-node run started by hand: node 0 writes the one result for all ranks.
            log.info("%s/%s: %s; this node writes no result", stage, ctx.variant, exc)
            return 0
        run_s = time.perf_counter() - t0
        # Most stages mark no phase inside run: their time is then "unmarked", never "0 s of
        # measurement" (the start-up before run is its own figure).
        inside = phases.Recorder.sums(rec.rows[before:])
        log.info("%s/%s: run %.2f s: measurement %.2f s and set-up %.2f s in marked phases, "
                 "%.2f s unmarked; start-up before it %.2f s", stage, ctx.variant, run_s,
                 inside[phases.MEASUREMENT], inside[phases.SETUP],
                 max(0.0, run_s - inside[phases.MEASUREMENT] - inside[phases.SETUP]), age)
        # Where the job's time went (issue 28): every phase, set-up or measurement, in the result.
        result.attrs.setdefault("phases", list(rec.rows))
        result.attrs.setdefault("run_s", run_s)
        with rec.phase("write result", phases.SETUP):
            path = results.write(result, args.out)
        log.info("%s/%s: wrote %s", stage, ctx.variant, path)
        return 0

    # Snakemake stops a job with SIGTERM: every stage then removes its temporaries (staging
    # folders, the half-written result) and stops what it launched, instead of dying mid-write.
    return lifetime.unwind_on_sigterm(run_and_write)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpulab.stage <stage> --out ...``: the entry point of a stage that needs no
    ``scripts/<stage>.py`` of its own, so that a new stage is its package and its spec entry. The
    package provides ``run(ctx)``, its docstring is the help, and optional ``extra_args(ap)``."""
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: python -m gpulab.stage <stage> [--help | stage arguments]")
    mod = importlib.import_module(f"gpulab.{argv[0]}")
    return stage_main(argv[0], mod.run, mod.__doc__, argv[1:],
                      extra_args=getattr(mod, "extra_args", None))


if __name__ == "__main__":
    raise SystemExit(main())
