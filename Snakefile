# gpulab: measure what a multi-GPU machine can really do.
#   snakemake --cores all                      # everything, CPU virtual devices when no GPU
#   snakemake --cores all --resources gpu=2    # cap GPU jobs at 2 concurrent GPUs
#   snakemake --cores all probe                # one stage (see README for the stage targets)
# The stages and their rules come from the registry, src/gpulab/stages.py.
import os
import sys
from pathlib import Path

SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)

from snakemake.exceptions import WorkflowError

from gpulab import config as _gpulab_config

try:  # Snakemake's own YAML error names neither the line nor the problem
    _gpulab_config.check_yaml("config.yaml")
except _gpulab_config.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

configfile: "config.yaml"


# Validates the config and sets every job's environment (gpulab.workflow.parse_time_setup).
include: "workflow/rules/common.smk"

# Set by that setup (gpulab.workflow.job_environment), so this never fails; declared, they reach
# jobs on remote executors (SLURM) too. The optional GPULAB_* variables (GPULAB_HOST,
# GPULAB_GPU_POOL, GPULAB_SLOT_DIR, GPULAB_CHROMIUM) cannot be listed: Snakemake requires every
# declared variable to be set.
envvars:
    *gpulab_workflow.JOB_ENV_DECLARED,

include: "workflow/rules/stages.smk"
# Health, baselines and the fleet view: targets over the stage rules (and per-node cluster jobs).
include: "workflow/rules/fleet.smk"
include: "workflow/rules/report.smk"
# `export`: every result as one tidy table (Parquet, CSV, JSON Lines).
include: "workflow/rules/export.smk"


rule all:
    default_target: True
    input:
        REPORT_HTML,
