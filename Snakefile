# gpulab: measure what a multi-GPU machine can really do.
#   snakemake --cores all                      # everything, CPU virtual devices when no GPU
#   snakemake --cores all --resources gpu=2    # cap GPU jobs at 2 concurrent GPUs
#   snakemake --cores all probe                # one stage (see README for the stage targets)
import os
import sys
from pathlib import Path

SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)
# Jobs run scripts in fresh interpreters; this lets them import gpulab without an install (GPU hosts
# with a pre-built Python environment).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from snakemake.exceptions import WorkflowError

from gpulab import config as _gpulab_config

try:  # Snakemake's own YAML error names neither the line nor the problem
    _gpulab_config.check_yaml("config.yaml")
except _gpulab_config.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

configfile: "config.yaml"

include: "workflow/rules/common.smk"

STAGE_RULE_FILES = ["probe", "data", "transfer", "kernels", "collectives", "sort", "gemm", "train"]
for _stage in STAGE_RULE_FILES:
    if Path(workflow.basedir, "workflow", "rules", f"{_stage}.smk").exists():
        include: f"workflow/rules/{_stage}.smk"

include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        REPORT_HTML,
