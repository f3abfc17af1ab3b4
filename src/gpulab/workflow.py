"""What the Snakemake workflow computes at parse time, as plain functions of config and host facts.

The ``.smk`` files hold rules and one-line calls into this module, so everything here is tested
without Snakemake (tests/test_workflow_module.py). Three parts:

- **code inputs** of each rule, computed by :mod:`gpulab.code_inputs` (imports and data files
  read, within ``gpulab``): editing one reruns exactly the jobs whose code reaches it;
- **resources**: GPU counts, host sharing (``host_quiet``), SLURM shapes, fleet node results;
- **parse-time side effects** (environment of every job, stale locks, resource registration),
  all in :func:`parse_time_setup`.

No stage is named here: stages come from the registry (:mod:`gpulab.stages`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

from gpulab import stages as registry
from gpulab.code_inputs import PACKAGE, code_closure, module_file, package_data


class WorkflowConfigError(ValueError):
    """A config that cannot run on this host (the Snakefile turns it into a WorkflowError)."""


# --- code inputs (gpulab.code_inputs) -----------------------------------------------------------

def _rel(paths: Iterable[Path], base: Path) -> list[str]:
    base_abs = Path(base).resolve()
    # normpath: Snakemake warns about (and may mismatch) paths that start with "./".
    return [os.path.normpath(os.path.join(base, os.path.relpath(p, base_abs))) for p in paths]


def section_file(spec: registry.StageSpec, base: Path) -> Path:
    return Path(base, "src", *spec.section_module().split(".")).with_suffix(".py")


def report_side_modules(stage: str, base: Path, sections: bool = True) -> list[Path]:
    """The modules of a stage that the report imports, never its job: its report section (unless
    ``sections`` is false) and its findings rules (gpulab.findings)."""
    spec = registry.STAGES.get(stage)
    files = [section_file(spec, base)] if spec and sections else []
    files.append(Path(base, "src", PACKAGE, stage, "findings.py"))
    return [f for f in files if f.is_file()]


def stage_code(stage: str, base: Path) -> list[str]:
    """Code inputs of a stage's jobs: its script (else the generic entry point), every module of its
    package but those only the report imports, and all they import and read, within ``gpulab``."""
    base = Path(base)
    src = base / "src"
    script = base / "scripts" / f"{stage}.py"
    roots = [script] if script.is_file() else [module_file(f"{PACKAGE}.stage", src)]
    pkg = src / PACKAGE / stage
    own = sorted(pkg.rglob("*.py")) if pkg.is_dir() else [pkg.with_suffix(".py")]
    report_side = {p.resolve() for p in report_side_modules(stage, base)}
    roots += [p for p in own if p.is_file() and p.resolve() not in report_side]
    if pkg.is_dir():
        roots += [p for p in package_data(src) if p.is_relative_to(pkg.resolve())]
    return _rel(code_closure(roots, src), base)


def script_code(script: str, base: Path) -> list[str]:
    """Code inputs of a job that runs ``scripts/<script>.py``: the script and all it reaches."""
    base = Path(base)
    return _rel(code_closure([base / "scripts" / f"{script}.py"], base / "src"), base)


def report_code(base: Path, stages: Iterable[str] | None = None, entry: str = "report",
                assembly: bool = False) -> list[str]:
    """Code inputs of a report rule: its script, the report package, the report sections of
    ``stages`` (default: every stage; one stage for a rule rendering that stage's chapter), and all
    they import and read (sections are imported by name at run time, so they are roots here).

    ``assembly``: the workflow's report job, which only assembles current fragments (each rendered
    by the fragment job whose code holds its section): the findings rules of every stage, no
    section, so editing one section re-renders its fragment and not every chapter's."""
    base = Path(base)
    src = base / "src"
    names = registry.ORDER if stages is None else list(stages)
    roots = [base / "scripts" / f"{entry}.py", *sorted((src / PACKAGE / "report").rglob("*.py"))]
    roots += [p for s in names for p in report_side_modules(s, base, sections=not assembly)]
    return _rel(code_closure([r for r in roots if r.is_file()], src), base)


def fragment_plan(stage_results: list[str], stages: list[str]) -> dict[str, dict[str, list[str]]]:
    """The workflow's fragment jobs, from the results the report reads (``results/<stage>/...``;
    on a cluster every node's): one per stage of ``stages`` that has results, in that order, with
    its ``own`` results (a change re-renders its fragment) and ``after``, every other stage's, which
    it only waits for (Snakemake's ancient()): no fragment renders while a timing job may still run,
    and once they all exist the fragments render side by side. Other files (a baseline comparison)
    are the report's alone."""
    own: dict[str, list[str]] = {s: [] for s in stages}
    for f in stage_results:
        parts = Path(f).parts
        if len(parts) > 2 and parts[1] in own:
            own[parts[1]].append(str(f))
    every = [f for fs in own.values() for f in fs]
    return {s: {"own": fs, "after": [f for f in every if f not in fs]} for s, fs in own.items() if fs}


# --- resources -----------------------------------------------------------------------------------

# Host sharing (config quiet_host): every timing job and every CPU-heavy job holds all of
# `host_quiet`, so no two of them ever run together on one host. The independent kernel jobs are
# one measurement meant to overlap: each holds an equal share, so they run together and nothing
# else beside them.
HOST_QUIET_UNITS = 1000


def host_quiet(spec: registry.StageSpec, quiet_host: bool, share: int = 1) -> int:
    """`host_quiet` units a job of ``spec`` holds: all for timing and CPU-heavy jobs (1/``share``
    of them for ``share`` jobs that run together by design), none for the rest or with
    ``quiet_host: false``."""
    if not quiet_host or not (spec.cpu_heavy or spec.timing_sensitive):
        return 0
    if share < 1:
        raise ValueError(f"host_quiet share must be >= 1, got {share}")
    return max(1, HOST_QUIET_UNITS // share)


def host_quiet_cpu_heavy(quiet_host: bool) -> int:
    """`host_quiet` units of CPU-heavy work that is no stage's job (rendering report figures, say):
    all of them, so it never runs beside a timed region."""
    return HOST_QUIET_UNITS if quiet_host else 0


def host_gpus(config: Mapping, pool: list[str]) -> int:
    """GPUs this host gives to jobs: config devices.gpus (cluster submit hosts), else the pool."""
    dev = config["devices"]
    if dev["backend"] == "cpu":
        return 0
    n = len(pool) if dev["gpus"] is None else dev["gpus"]
    if dev["backend"] == "cuda" and n == 0:
        raise WorkflowConfigError("config devices.backend is 'cuda' but this host has no NVIDIA GPU")
    return n


def resource_value(value):
    """A global resource's number (Snakemake may wrap it)."""
    return getattr(value, "value", value)


def gpus_for(spec: registry.StageSpec, config: Mapping, host_gpus: int, cap=None) -> int:
    """Concrete GPU count a stage's jobs ask for, checked against the host and the `gpu` cap."""
    if spec.gpus == "none" or host_gpus == 0:
        return 0
    want = config[spec.name]["gpus"]
    if want == "all":
        want = host_gpus
    if want > host_gpus:
        raise WorkflowConfigError(
            f"config {spec.name}.gpus asks for {want} GPU(s) but this host has {host_gpus}")
    cap = resource_value(cap)
    if isinstance(cap, int) and want > cap:
        raise WorkflowConfigError(
            f"config {spec.name}.gpus asks for {want} GPU(s) but --resources gpu={cap}; "
            "Snakemake would silently run it with fewer. Lower the stage's gpus or raise the cap.")
    return want


def stage_threads(spec: registry.StageSpec, gpus: int, cpu_devices: int) -> int:
    # Every rank is a busy process: on CPU a multi-process job takes as many cores as it has ranks.
    return (gpus or cpu_devices) if spec.multiprocess else 1


def slurm_resources(gpus: int, nnodes: int) -> dict:
    """Resources of a multi-process stage's job: `gpu` as everywhere, and for N > 1 nodes ONE SLURM
    job of N nodes (see common.smk `slurm_resources` for the plugin details)."""
    if nnodes <= 1:
        return {"gpu": gpus}
    res = {"gpu": 0, "nodes": nnodes, "tasks": nnodes, "mpi": "srun", "tasks_per_gpu": 0}
    if gpus:
        res["gres"] = f"gpu:{gpus}"
    return res


# --- payloads ------------------------------------------------------------------------------------

def write_payload(name: str, payload, root: Path = Path("results", "payloads")) -> str:
    """Path of a file holding ``payload``, named by its hash: a rule passes the path as its param, so
    the job reruns exactly when the payload changes, and the reason Snakemake prints stays one
    line. Written once, atomically, never rewritten (jobs may be reading it)."""
    from gpulab import results

    path = Path(root, f"{name}-{results.config_hash(payload)}.json")
    if not path.exists():
        results.atomic_write_text(path, json.dumps(payload, sort_keys=True, indent=1) + "\n")
    return str(path)


# --- parse-time side effects ---------------------------------------------------------------------

# Set (not defaulted) for every job: CUDA's own default order is "fastest first", which need not be
# nvidia-smi's PCI order; the slot pool's ids and every recorded id must mean the same GPU to all.
JOB_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
# Defaults a user may override (NVLink SHARP multicast off unless asked for).
JOB_ENV_DEFAULTS = {"NCCL_NVLS_ENABLE": "0"}
# What the Snakefile declares (`envvars:`), so that jobs on remote executors get it too.
JOB_ENV_DECLARED = ("PYTHONPATH", *JOB_ENV_DEFAULTS, *JOB_ENV)


def job_environment(environ: Mapping[str, str], src: str) -> dict[str, str]:
    """Variables every job gets: gpulab's source first on PYTHONPATH (jobs run fresh interpreters
    and must import this tree, installed or not), the forced ones, the defaults."""
    env = {k: environ.get(k, v) for k, v in JOB_ENV_DEFAULTS.items()}
    env.update(JOB_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, environ.get("PYTHONPATH")) if p)
    return env


def parse_time_setup(workflow, config: Mapping, environ=os.environ,
                     say: Callable[[str], None] = print) -> dict:
    """Every side effect of parsing the workflow, in one place: the jobs' environment, the owner
    marker jobs watch (they stop when this Snakemake dies), stale Snakemake locks of a killed run
    removed (main process only), and the `gpu` and `host_quiet` resources registered.

    ``workflow`` needs ``basedir``, ``is_main_process``, ``global_resources`` and
    ``register_resource`` (Snakemake's object, or a fake in tests). Returns the host facts:
    ``{"pool": [...], "host_gpus": N}``."""
    from gpulab import lifetime, slots

    environ.update(job_environment(environ, str(Path(workflow.basedir) / "src")))
    environ[lifetime.OWNER_ENV] = lifetime.owner_value()
    if workflow.is_main_process:
        for lock in lifetime.clear_stale_snakemake_locks():
            say(f"gpulab: removed {lock} left by a killed run")
    pool = slots.pool_ids()
    gpus = host_gpus(config, pool)
    # The default is the detected count, so a plain `snakemake --cores all` never over-subscribes.
    if "gpu" not in workflow.global_resources:
        workflow.register_resource("gpu", gpus)
    elif gpus == 0 and workflow.is_main_process:
        cap = resource_value(workflow.global_resources["gpu"])
        say(f"gpulab: --resources gpu={cap} but this host has no GPU to use "
            f"(devices.backend={config['devices']['backend']}): every stage runs on CPU, on "
            f"{config['devices']['cpu_devices']} virtual devices")
    if "host_quiet" not in workflow.global_resources:
        workflow.register_resource("host_quiet", HOST_QUIET_UNITS)
    return {"pool": pool, "host_gpus": gpus}
