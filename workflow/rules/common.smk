# Helpers shared by all rules: config validation, host label, GPU counts, config slices.
import json
import sys

from snakemake.exceptions import WorkflowError

from gpulab import config as gpulab_config
from gpulab import lifetime as gpulab_lifetime
from gpulab import results as gpulab_results
from gpulab import slots as gpulab_slots

try:
    # Any key can be set from the command line: --config 'devices={gpus: 8}' (nested YAML).
    _cli = gpulab_config.apply_overrides(config, workflow.config_settings.config or {})
    _files = {Path(f).resolve(): f for f in [*workflow.configfiles, *workflow.config_settings.configfiles]}
    gpulab_config.validate(
        config,
        Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml",
        [os.path.relpath(f) for f in _files],
        command_line=_cli,
    )
    # Rules a schema cannot state, checked here so that no job starts on a config that can't work.
    from gpulab.train import load_config as _train_config

    _train_config(config["train"])
except gpulab_config.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

# Jobs stop themselves when the Snakemake process that started them dies (even by SIGKILL).
os.environ[gpulab_lifetime.OWNER_ENV] = gpulab_lifetime.owner_value()
if workflow.is_main_process:
    for _lock in gpulab_lifetime.clear_stale_snakemake_locks():
        print(f"gpulab: removed {_lock} left by a killed run", file=sys.stderr)

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
elif HOST_GPUS == 0 and workflow.is_main_process:
    _cap = workflow.global_resources["gpu"]
    print(f"gpulab: --resources gpu={getattr(_cap, 'value', _cap)} but this host has no GPU to use "
          f"(devices.backend={BACKEND}): every stage runs on CPU, on "
          f"{config['devices']['cpu_devices']} virtual devices", file=sys.stderr)

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


def stage_shell(stage, extra=""):
    """Shell command of a stage job: hold its GPU ids, run the script, keep a log."""
    return (
        f"{SLOT} --gpus {{resources.gpu}} -- {PY} {SCRIPTS}/{stage}.py "
        f"--config-json {{params.cfg:q}} --variant {{params.variant}} --out {{output.h5}} {extra} "
        "2>&1 | tee {log}"
    )
