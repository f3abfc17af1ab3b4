# Helpers shared by all rules: config validation, host label, GPU counts, config payloads, code.
import json
import sys

from snakemake.exceptions import WorkflowError

from gpulab import config as gpulab_config
from gpulab import results as gpulab_results
from gpulab import stages as gpulab_stages
from gpulab import workflow as gpulab_workflow

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

# Every parse-time side effect (jobs' environment, stale locks, the `gpu` and `host_quiet`
# resources) happens in this one call; see gpulab.workflow.parse_time_setup.
try:
    _HOST_FACTS = gpulab_workflow.parse_time_setup(
        workflow, config, say=lambda line: print(line, file=sys.stderr))
except gpulab_workflow.WorkflowConfigError as exc:
    raise WorkflowError(str(exc)) from None

HOST = config["host_label"] or gpulab_results.host_name()
PY = sys.executable
SCRIPTS = os.path.relpath(Path(workflow.basedir) / "scripts")
SLOT = f"{PY} -m gpulab.slots"
BACKEND = config["devices"]["backend"]
BASE = Path(os.path.relpath(workflow.basedir))
# GPUs a job host can give to jobs: config devices.gpus (cluster submit hosts), else the slot pool
# (GPULAB_GPU_POOL, else CUDA_VISIBLE_DEVICES, else every GPU detected here).
POOL = _HOST_FACTS["pool"]
HOST_GPUS = _HOST_FACTS["host_gpus"]
HOST_QUIET_UNITS = gpulab_workflow.HOST_QUIET_UNITS


def _checked(fn, *args, **kwargs):
    """A gpulab.workflow call whose config error stops the run as a one-line WorkflowError."""
    try:
        return fn(*args, **kwargs)
    except gpulab_workflow.WorkflowConfigError as exc:
        raise WorkflowError(str(exc)) from None


def host_quiet(stage, share=1):
    """The `host_quiet` units a job of ``stage`` holds (``share``: jobs meant to run together)."""
    return gpulab_workflow.host_quiet(gpulab_stages.get(stage), config["quiet_host"], share)


def host_quiet_cpu_heavy():
    """`host_quiet` units of CPU-heavy work that runs no stage (report figures): the whole host."""
    return gpulab_workflow.host_quiet_cpu_heavy(config["quiet_host"])


def gpus_for(stage):
    """Concrete GPU count a stage's jobs ask for, checked against what the host has."""
    return _checked(gpulab_workflow.gpus_for, gpulab_stages.get(stage), config, HOST_GPUS,
                    workflow.global_resources.get("gpu"))


def write_payload(name, payload):
    """Path of a file holding ``payload``, named by its hash (see gpulab.workflow.write_payload)."""
    return gpulab_workflow.write_payload(name, payload)


def stage_payload(stage):
    """The config payload of a stage's jobs: its section and the `devices` keys its spec reads."""
    return write_payload(stage, gpulab_stages.get(stage).payload(config))


def section_file(spec):
    return gpulab_workflow.section_file(spec, BASE)


def stage_code(stage):
    """Code inputs of a stage's jobs: every module and data file of gpulab its code reaches (computed
    by gpulab.workflow.stage_code): editing one reruns the stage (and the report)."""
    return gpulab_workflow.stage_code(stage, BASE)


def script_code(script):
    """Code inputs of a job running scripts/<script>.py (computed, see gpulab.workflow)."""
    return gpulab_workflow.script_code(script, BASE)


def report_code(stages=None, assembly=False):
    """Code inputs of a report rule (of one stage's chapter where ``stages`` names it; of the
    assembly of current fragments where ``assembly``)."""
    return gpulab_workflow.report_code(BASE, stages, assembly=assembly)


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
    return gpulab_workflow.stage_threads(spec, gpus_for(spec.name), config["devices"]["cpu_devices"])


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
    return gpulab_workflow.slurm_resources(
        gpus_for(stage), config["devices"]["nodes"]["nnodes"])


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
