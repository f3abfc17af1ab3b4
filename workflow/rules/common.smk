# Helpers shared by all rules: config validation, host label, GPU counts, config payloads, code.
import json
import sys

from snakemake.exceptions import WorkflowError

from gpulab import config as gpulab_config
from gpulab import lifetime as gpulab_lifetime
from gpulab import results as gpulab_results
from gpulab import slots as gpulab_slots
from gpulab import stages as gpulab_stages

# The one validation of the config (defaults filled in). Jobs get slices of it marked validated, so
# the stage scripts do not validate again.
try:
    # Any key can be set from the command line: --config 'devices={gpus: 8}' (nested YAML).
    _cli = gpulab_config.apply_overrides(config, workflow.config_settings.config or {})
    _files = {Path(f).resolve(): f for f in [*workflow.configfiles, *workflow.config_settings.configfiles]}
    gpulab_config.validate(config, None, [os.path.relpath(f) for f in _files], command_line=_cli)
    # Rules a schema cannot state (each stage's config_check hook), checked here so that no job
    # starts on a config that can't work.
    gpulab_stages.check_configs(config)
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
BASE = Path(os.path.relpath(workflow.basedir))

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

# Host sharing (config quiet_host): a CPU-heavy job takes every `host_quiet` unit, a
# timing-sensitive job one, so the two never run at once while timing jobs still run side by side.
# Which stage is which is declared in its StageSpec (gpulab.stages).
HOST_QUIET_UNITS = 1000
if "host_quiet" not in workflow.global_resources:
    workflow.register_resource("host_quiet", HOST_QUIET_UNITS)


def host_quiet(stage):
    """The `host_quiet` units a job of ``stage`` holds (0 with config quiet_host: false)."""
    from gpulab import stages as gpulab_stages

    spec = gpulab_stages.get(stage)
    if not config.get("quiet_host", True):
        return 0
    return HOST_QUIET_UNITS if spec.cpu_heavy else 1 if spec.timing_sensitive else 0



def gpus_for(stage):
    """Concrete GPU count a stage's jobs ask for, checked against what the host has."""
    if gpulab_stages.get(stage).gpus == "none":
        return 0
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


def write_payload(name, payload):
    """Path of a file holding ``payload``, named by its hash: a rule passes the path as its param, so
    the job reruns exactly when the payload changes, and the reason Snakemake prints stays one
    line. The file is written once, atomically, and never rewritten (jobs may be reading it)."""
    path = Path("results", "payloads", f"{name}-{gpulab_results.config_hash(payload)}.json")
    if not path.exists():
        gpulab_results.atomic_write_text(path, json.dumps(payload, sort_keys=True, indent=1) + "\n")
    return str(path)


def stage_payload(stage):
    """The config payload of a stage's jobs: its section and the `devices` keys its spec reads."""
    return write_payload(stage, gpulab_stages.get(stage).payload(config))


def section_file(spec):
    return BASE / "src" / Path(*spec.section_module().split(".")).with_suffix(".py")


def stage_code(stage):
    """Source files a stage depends on: editing them reruns the stage (and the report). Its schema
    is one of them; its report section is the report's, not the stage's."""
    shared = [BASE / "src" / "gpulab" / f for f in
              ("devices.py", "slots.py", "timing.py", "results.py", "stage.py", "launch.py")]
    pkg = BASE / "src" / "gpulab" / stage
    if pkg.is_dir():
        files = sorted(p for p in pkg.rglob("*") if p.suffix == ".py" or p.name == "schema.yaml")
    else:
        files = [pkg.with_suffix(".py")]
    if stage in gpulab_stages.STAGES:
        files = [p for p in files if p != section_file(gpulab_stages.get(stage))]
    script = BASE / "scripts" / f"{stage}.py"
    return [str(p) for p in shared + files + [script] if p.exists()]


def stage_inputs(stage):
    """A stage job's code inputs, its script (where it has one of its own) named `script`."""
    script = Path(SCRIPTS, f"{stage}.py")
    return {"code": stage_code(stage), **({"script": str(script)} if script.exists() else {})}


def stage_entry(stage):
    """How a stage's job starts: its own script, else gpulab's generic stage entry point. (A path
    in params would have to be kept in step with the inputs by hand: lint says take it from them.)"""
    if Path(SCRIPTS, f"{stage}.py").exists():
        return lambda wildcards, input: input.script
    return f"-m gpulab.stage {stage}"


def stage_shell(extra="", slots="{resources.gpu}"):
    """Shell command of a stage job: hold its GPU ids, run the stage, keep a log. Everything
    stage-specific comes from the job's params: a shell directive is evaluated again when its job
    runs, after a loop defining rules (stages.smk) has moved on. `slots`: the GPU ids held, the
    job's `gpu` resource, or this node's count where a multi-node job's GPUs are a per-node `gres`
    (see slurm_resources)."""
    return (
        f"{SLOT} --gpus {slots} -- {PY} {{params.entry}} "
        f"--payload {{params.payload:q}} --variant {{params.variant}} --out {{output.h5}} {extra} "
        "2>&1 | tee {log}"
    )


def stage_args(spec):
    """The stage's extra script arguments with the job's {input.<name>}/{output.<name>} filled in."""
    return lambda wildcards, input, output: spec.args.format(input=input, output=output)


def stage_threads(spec):
    # Every rank is a busy process: on CPU a multi-process job takes as many cores as it has ranks.
    return (gpus_for(spec.name) or config["devices"]["cpu_devices"]) if spec.multiprocess else 1


def stage_output(spec, name, template):
    path = spec.path(template, HOST)
    return directory(path) if name in spec.output_dirs else path


def stage_job(spec):
    """Result file of one job of the stage ({variant} a wildcard where it has variants)."""
    return spec.path(spec.result, HOST, "{variant}" if spec.has_variants else "main")


def stage_log(spec):
    return str(Path("results", "logs", *Path(stage_job(spec)).parts[1:]).with_suffix(".log"))


def stage_result(spec):
    path = stage_job(spec)
    # A stage with a caption in workflow/report/ shows up in `snakemake --report`.
    if Path(workflow.basedir, "workflow", "report", f"{spec.name}.rst").exists():
        return report(path, caption=f"../report/{spec.name}.rst", category=spec.title)
    return path


def slurm_resources(stage):
    """Resources of a multi-process stage's job (collectives, train): `gpu` as everywhere, and for
    `devices.nodes.nnodes: N > 1` ONE SLURM job of N nodes (snakemake-executor-plugin-slurm):
    `--nodes=N --ntasks=N`, GPUs per node as `--gres=gpu:K` (the plugin's `--gpus=K` counts GPUs
    per job: SLURM spreads them over the nodes, and rejects it beside a per-node count, so `gpu`
    is 0 there). `mpi` makes the plugin run the command once on the batch host instead of inside
    `srun -n1`; the command's own `srun` (gpulab.launch) starts one torchrun agent per node.
    `tasks_per_gpu: 0` keeps the plugin from turning `tasks` into `--ntasks-per-gpu`.
    stages.smk gives multi-process stages these resources and `params.slots = gpus_for(stage)`."""
    gpus = gpus_for(stage)
    nnodes = int(config["devices"].get("nodes", {}).get("nnodes", 1))
    if nnodes <= 1:
        return {"gpu": gpus}
    res = {"gpu": 0, "nodes": nnodes, "tasks": nnodes, "mpi": "srun", "tasks_per_gpu": 0}
    if gpus:
        res["gres"] = f"gpu:{gpus}"
    return res


# Fleet health jobs (fleet.smk): where a node's health results land, and its per-stage commands.

def _stage_of(path):
    return Path(path).parts[1]


def node_results(node):
    """The health results of one node, where the per-stage rules would put them for that host."""
    return gpulab_stages.health_results(node)


def fleet_node_cmd(stage):
    """One health stage of a node job (fleet.smk), its payload a param of that job."""
    variant = gpulab_stages.get(stage).health_variant
    script = Path(SCRIPTS, f"{stage}.py")
    entry = script if script.exists() else f"-m gpulab.stage {stage}"
    return (f"{SLOT} --gpus {{resources.gpu}} -- {PY} {entry} "
            f"--payload {{params.{stage}:q}} --variant {variant} --out {{output.{stage}}}")
