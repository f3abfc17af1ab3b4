"""The stage registry: one declared :class:`StageSpec` per stage, in report order.

Everything that used to list stage names by hand reads this: the Snakefile's rules, the config
schema (each stage's schema ships inside its package as ``schema.yaml``), the report order and
each stage's report section. Adding a stage = its package, its schema, its entry here, its tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Callable, Mapping

# `devices` keys, by what a stage does with them. Only the keys a stage reads are in its jobs'
# config payload, so e.g. a multi-node setting does not rerun a single-process stage.
SINGLE_PROCESS_KEYS = ("backend", "cpu_devices", "gpus")
MULTI_PROCESS_KEYS = SINGLE_PROCESS_KEYS + ("nodes", "nvls")


def main_only(config: Mapping, host_gpus: int) -> list[str]:
    return ["main"]


@dataclass(frozen=True)
class StageSpec:
    name: str
    title: str
    # "config": the stage's own `gpus` key ('all' or a count); "none": CPU-only, holds no GPU.
    gpus: str = "config"
    # One process per rank (gpulab.launch): on CPU its job takes a core per rank.
    multiprocess: bool = False
    devices_keys: tuple[str, ...] = SINGLE_PROCESS_KEYS
    tables: tuple[str, ...] = ()
    # Job variants for (config, GPUs of the job host); the default is one job, "main". A stage with
    # its own variants gets a job rule `<name>_variant` and a target rule `<name>` over them all.
    variants: Callable[[Mapping, int], list[str]] = main_only
    # Module of its report section; None: its package's section.py, else
    # gpulab.report.sections.<name>, else the generic section.
    section: str | None = None
    # Extra rules (a .smk file relative to the repo root) for a stage with more than one job shape.
    rules: str | None = None
    # The rest shapes its generated rule. Paths are under results/, with {host} and {variant}.
    result: str = "{stage}/{host}/{variant}.h5"
    # Further named outputs of the job (`output_dirs` names those that are folders), and named
    # inputs other rules make; `args` passes them to the script ({input.<name>}, {output.<name>}).
    outputs: Mapping[str, str] = field(default_factory=dict)
    output_dirs: tuple[str, ...] = ()
    inputs: Mapping[str, str] = field(default_factory=dict)
    args: str = ""
    # Named inputs that the config lists (e.g. the user's own data files): replacing one reruns the
    # stage. A function of the validated config, returning {name: [paths]}.
    config_inputs: Callable[[Mapping], Mapping[str, list]] | None = None
    # Snakemake priority: a stage that checks the user's inputs runs ahead of long benchmarks.
    priority: int = 0
    # Results of its extra rules that the report reads as well.
    extra_results: tuple[str, ...] = ()
    # Host sharing: a timing-sensitive job's figures suffer from CPU-heavy jobs beside it on the same
    # host (the data stage ran beside transfer and GEMM on an H200). Unless config
    # `quiet_host: false`, the rules keep the two apart (see workflow/rules/common.smk,
    # `host_resources`).
    timing_sensitive: bool = False
    cpu_heavy: bool = False
    # Hooks, as import strings "module:function" (imported only when used, so the registry stays
    # light and nothing below a stage imports it):
    # - metrics: extract(path, attrs, group) -> metric rows for baselines and the fleet view
    #   (gpulab.metrics); None: the stage's results give no comparable metric.
    metrics: str | None = None
    # - health_variant: the job variant a health check runs (the health preset's stage list, the
    #   `health` target, one health job per cluster node); None: not part of health checks.
    health_variant: str | None = None
    # - config_check: check(section) raising gpulab.config.ConfigError for what the schema cannot
    #   state, run once when the workflow is parsed, before any job starts.
    config_check: str | None = None

    @property
    def package(self) -> str:
        return f"gpulab.{self.name}"

    @property
    def in_health(self) -> bool:
        return self.health_variant is not None

    @property
    def has_variants(self) -> bool:
        return self.variants is not main_only

    def _file(self, name: str):
        # Through the light top-level package: resources.files(self.package) would import the
        # stage's package (torch and all) where only a data file is wanted.
        return resources.files("gpulab").joinpath(self.name, name)

    def schema_text(self) -> str:
        return self._file("schema.yaml").read_text()

    def settings_class(self):
        """The frozen typed view of the stage's section, ``<package>.settings:Settings`` (a
        :class:`gpulab.config.TypedSection`); None for a stage without a settings.py, which reads
        its section as the plain validated dict (``ctx.config``)."""
        if not self._file("settings.py").is_file():
            return None
        return hook(f"{self.package}.settings:Settings")

    def section_module(self) -> str:
        """``section`` where set, else the stage's own ``section.py``, else the report package's."""
        if self.section:
            return self.section
        if self._file("section.py").is_file():
            return f"{self.package}.section"
        return f"gpulab.report.sections.{self.name}"

    def path(self, template: str, host: str, variant: str = "{variant}") -> str:
        """``template`` (under results/) for ``host``; by default {variant} stays a wildcard."""
        return "results/" + template.format(stage=self.name, host=host, variant=variant)

    def final_results(self, config: Mapping, host: str, host_gpus: int) -> list[str]:
        """Every result file of this stage on ``host``: what its target rule and the report need."""
        return ([self.path(self.result, host, v) for v in self.variants(config, host_gpus)]
                + [self.path(t, host) for t in self.extra_results])

    def payload(self, config: Mapping) -> dict:
        """What a job of this stage reads: its section and the `devices` keys it uses, no more, so
        that a change anywhere else does not rerun it. `validated`: this is a slice of a config
        validated as a whole (see gpulab.stage.context_from_args)."""
        devices = {k: config["devices"][k] for k in self.devices_keys if k in config["devices"]}
        return {"stage": config[self.name], "devices": devices, "validated": True}


def _data_inputs(config: Mapping) -> dict[str, list]:
    return {"inputs": [item["path"] for item in config["data"]["inputs"]]}


def _collectives_variants(config: Mapping, host_gpus: int) -> list[str]:
    # The NCCL path variants need GPUs: without them only the default job runs, and its result
    # records them as not applicable.
    return list(config["collectives"]["variants"]) if host_gpus else ["default"]


def _train_variants(config: Mapping, host_gpus: int) -> list[str]:
    return list(config["train"]["variants"])


STAGES: dict[str, StageSpec] = {s.name: s for s in [
    # tables: those every result of the stage has (GPU-only tables such as transfer's p2p_sweep
    # come on GPU hosts only; kernels' job variants write job/jobs tables of their own).
    StageSpec("probe", "Hardware probe", tables=("host", "numa", "software", "gpus", "checks", "not_applicable"),
              section="gpulab.probe.section", result="probe/{host}.h5",
              metrics="gpulab.probe.metrics:extract", health_variant="main",
              outputs={"json": "probe/{host}.json", "md": "probe/{host}.md"}),
    StageSpec("data", "Data loading", gpus="none",
              tables=("loads", "writes", "datasets", "checks", "not_applicable"),
              section="gpulab.data.section", cpu_heavy=True, config_inputs=_data_inputs, priority=50,
              rules="workflow/rules/data.smk", outputs={"files": "data/{host}/files"},
              output_dirs=("files",), args="--files-dir {output.files}"),
    StageSpec("transfer", "Transfers and bandwidth",
              tables=("host_memcpy", "host_threads", "p2p", "bars", "checks", "not_applicable"),
              section="gpulab.transfer.section", timing_sensitive=True,
              metrics="gpulab.transfer.metrics:extract", health_variant="main"),
    StageSpec("kernels", "Kernels",
              tables=("divide", "split", "split_phases", "bars", "checks", "not_applicable"),
              section="gpulab.kernels.section", timing_sensitive=True,
              rules="workflow/rules/kernels.smk", extra_results=("kernels/{host}/jobs.h5",)),
    StageSpec("collectives", "Collectives", multiprocess=True, devices_keys=MULTI_PROCESS_KEYS,
              tables=("library", "allreduce_algorithms", "samples", "bars", "checks", "not_applicable"),
              variants=_collectives_variants, section="gpulab.collectives.section",
              timing_sensitive=True, metrics="gpulab.collectives.metrics:extract",
              health_variant="default"),
    StageSpec("sort", "Multi-device sorting", tables=("runs", "phases", "bars", "checks", "not_applicable"),
              section="gpulab.sort.section", timing_sensitive=True),
    StageSpec("gemm", "Multi-device GEMM", multiprocess=True, devices_keys=MULTI_PROCESS_KEYS,
              tables=("single", "multi", "scaling", "bars", "checks", "not_applicable"),
              section="gpulab.gemm.section", timing_sensitive=True,
              metrics="gpulab.gemm.metrics:extract", health_variant="main"),
    StageSpec("train", "Parallel training", multiprocess=True, devices_keys=MULTI_PROCESS_KEYS,
              tables=("throughput", "ddp", "bars", "checks", "not_applicable"),
              variants=_train_variants, section="gpulab.train.section", timing_sensitive=True,
              config_check="gpulab.train:check_config",
              inputs={"digits": "data/{host}/train/digits.h5"}, args="--data {input.digits}"),
]}

ORDER = list(STAGES)


def health_stages() -> list[str]:
    """The stages a health check runs, in report order."""
    return [n for n, s in STAGES.items() if s.in_health]


def health_results(node: str) -> dict[str, str]:
    """{stage: result file} of one node's health check, where each stage's own rule would put it."""
    return {n: s.path(s.result, node, s.health_variant) for n, s in STAGES.items() if s.in_health}


def hook(ref: str):
    """The function an import string "module:function" names."""
    import importlib

    mod, _, fn = ref.partition(":")
    if not fn:
        raise ValueError(f"hook {ref!r}: write it as 'module:function'")
    return getattr(importlib.import_module(mod), fn)


def check_configs(config: Mapping) -> None:
    """Every stage's parse-time config check (its ``config_check`` hook) on its section."""
    for name, spec in STAGES.items():
        if spec.config_check and name in config:
            hook(spec.config_check)(config[name])


def get(name: str) -> StageSpec:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"no stage {name!r} (stages: {', '.join(STAGES)})") from None
