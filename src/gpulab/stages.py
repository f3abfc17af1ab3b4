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
    multiprocess: bool = False
    devices_keys: tuple[str, ...] = SINGLE_PROCESS_KEYS
    tables: tuple[str, ...] = ()
    variants: Callable[[Mapping, int], list[str]] = main_only
    # Module of its report section; None: the generic section.
    section: str | None = None
    # Extra rules (a .smk file relative to the repo root) for a stage with more than one job shape.
    rules: str | None = None

    @property
    def package(self) -> str:
        return f"gpulab.{self.name}"

    def schema_text(self) -> str:
        return resources.files(self.package).joinpath("schema.yaml").read_text()

    def section_module(self) -> str:
        return self.section or f"gpulab.report.sections.{self.name}"


def _collectives_variants(config: Mapping, host_gpus: int) -> list[str]:
    # The NCCL path variants need GPUs: without them only the default job runs, and its result
    # records them as not applicable.
    return list(config["collectives"]["variants"]) if host_gpus else ["default"]


def _train_variants(config: Mapping, host_gpus: int) -> list[str]:
    return list(config["train"]["variants"])


STAGES: dict[str, StageSpec] = {s.name: s for s in [
    StageSpec("probe", "Hardware probe", tables=("gpus", "host", "links")),
    StageSpec("data", "Data loading", gpus="none", tables=("loads", "checks")),
    StageSpec("transfer", "Transfers and bandwidth", tables=("p2p", "bars", "checks")),
    StageSpec("kernels", "Kernels", tables=("divide", "split", "bars", "checks")),
    StageSpec("collectives", "Collectives", multiprocess=True, devices_keys=MULTI_PROCESS_KEYS,
              tables=("library", "allreduce_algorithms", "samples", "bars", "checks", "not_applicable"),
              variants=_collectives_variants, section="gpulab.collectives.section"),
    StageSpec("sort", "Multi-device sorting", tables=("runs", "phases", "bars", "checks", "not_applicable"),
              section="gpulab.sort.section"),
    StageSpec("gemm", "Multi-device GEMM", multiprocess=True, devices_keys=MULTI_PROCESS_KEYS,
              tables=("single", "multi", "scaling", "bars", "checks", "not_applicable"),
              section="gpulab.gemm.section"),
    StageSpec("train", "Parallel training", multiprocess=True, devices_keys=MULTI_PROCESS_KEYS,
              tables=("throughput", "ddp", "bars", "checks", "not_applicable"),
              variants=_train_variants, section="gpulab.train.section"),
]}

ORDER = list(STAGES)


def get(name: str) -> StageSpec:
    try:
        return STAGES[name]
    except KeyError:
        raise KeyError(f"no stage {name!r} (stages: {', '.join(STAGES)})") from None
