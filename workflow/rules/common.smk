# Helpers shared by all rules: config validation, host label, GPU counts, config slices.
import json
import sys

from snakemake.exceptions import WorkflowError

from gpulab import config as gpulab_config
from gpulab import results as gpulab_results
from gpulab import slots as gpulab_slots

try:
    gpulab_config.validate(
        config,
        Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml",
        [str(f) for f in workflow.configfiles],
    )
except gpulab_config.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

HOST = config.get("host_label") or gpulab_results.host_name()
PY = sys.executable
SCRIPTS = os.path.relpath(Path(workflow.basedir) / "scripts")
SLOT = f"{PY} -m gpulab.slots"
BACKEND = config["devices"]["backend"]

# GPUs a job host can give to jobs: config devices.gpus (cluster submit hosts), else the slot pool
# (GPULAB_GPU_POOL, else CUDA_VISIBLE_DEVICES, else every GPU detected here).
POOL = gpulab_slots.pool_ids()
_cfg_gpus = config["devices"].get("gpus")
HOST_GPUS = 0 if BACKEND == "cpu" else (len(POOL) if _cfg_gpus is None else _cfg_gpus)
if BACKEND == "cuda" and HOST_GPUS == 0:
    raise WorkflowError("config devices.backend is 'cuda' but this host has no NVIDIA GPU")

# The default is the detected count, so a plain `snakemake --cores all` never over-subscribes GPUs.
if "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", HOST_GPUS)

# Every stage appends its final outputs here; the report depends on all of them.
STAGE_RESULTS = []


def gpus_for(stage):
    """Concrete GPU count a stage's jobs ask for, checked against what the host has."""
    want = config[stage].get("gpus", "all")
    if HOST_GPUS == 0:
        return 0
    if want == "all":
        want = HOST_GPUS
    cap = workflow.global_resources.get("gpu")
    cap = getattr(cap, "value", cap)
    if want > HOST_GPUS:
        raise WorkflowError(
            f"config {stage}.gpus asks for {want} GPU(s) but this host has {HOST_GPUS}")
    if isinstance(cap, int) and want > cap:
        raise WorkflowError(
            f"config {stage}.gpus asks for {want} GPU(s) but --resources gpu={cap}; "
            "Snakemake would silently run it with fewer. Lower the stage's gpus or raise the cap.")
    return want


def stage_payload(stage):
    """The config slice a stage's jobs see: changing it reruns exactly that stage's jobs."""
    return json.dumps({"stage": config[stage], "devices": config["devices"]}, sort_keys=True)


def stage_code(stage):
    """Source files a stage depends on: editing them reruns the stage (and the report)."""
    base = Path(os.path.relpath(workflow.basedir))
    shared = [base / "src" / "gpulab" / f for f in
              ("devices.py", "slots.py", "timing.py", "results.py", "stage.py", "launch.py")]
    pkg = base / "src" / "gpulab" / stage
    files = sorted(pkg.rglob("*.py")) if pkg.is_dir() else [pkg.with_suffix(".py")]
    script = base / "scripts" / f"{stage}.py"
    return [str(p) for p in shared + files + [script] if p.exists()]


def stage_shell(stage, extra="", slots="{resources.gpu}"):
    """Shell command of a stage job: hold its GPU ids (`slots`: the job's `gpu` resource, or this
    node's count where a multi-node job's GPUs are a per-node `gres`), run the script, keep a log."""
    return (
        f"{SLOT} --gpus {slots} -- {PY} {SCRIPTS}/{stage}.py "
        f"--config-json {{params.cfg:q}} --variant {{params.variant}} --out {{output.h5}} {extra} "
        "2>&1 | tee {log}"
    )


def slurm_resources(stage):
    """Resources of a multi-process stage's job (collectives, train): `gpu` as everywhere, and for
    `devices.nodes.nnodes: N > 1` ONE SLURM job of N nodes (snakemake-executor-plugin-slurm):
    `--nodes=N --ntasks=N`, GPUs per node as `--gres=gpu:K` (the plugin's `--gpus=K` counts GPUs
    per job: SLURM spreads them over the nodes, and rejects it beside a per-node count, so `gpu`
    is 0 there). `mpi` makes the plugin run the command once on the batch host instead of inside
    `srun -n1`; the command's own `srun` (gpulab.launch) starts one torchrun agent per node.
    `tasks_per_gpu: 0` keeps the plugin from turning `tasks` into `--ntasks-per-gpu`.
    Use as `resources: **slurm_resources(stage)` with `shell: stage_shell(stage, slots=gpus_for(stage))`."""
    gpus = gpus_for(stage)
    nnodes = int(config["devices"].get("nodes", {}).get("nnodes", 1))
    if nnodes <= 1:
        return {"gpu": gpus}
    res = {"gpu": 0, "nodes": nnodes, "tasks": nnodes, "mpi": "srun", "tasks_per_gpu": 0}
    if gpus:
        res["gres"] = f"gpu:{gpus}"
    return res
