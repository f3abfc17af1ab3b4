# Data loading: training sets for the training stage, and the CSV/JSON/HDF5 load benchmark.
# CPU-only (no GPU slot is held): loading is host work; host->device copies are the transfer stage.
DATA_TRAIN_SETS = {
    "digits": f"results/data/{HOST}/train/digits.h5",
    "tabular": f"results/data/{HOST}/train/tabular.h5",
}


# Only the code and config that shape the training sets: editing or resizing the benchmark must
# not rebuild them (and so retrain everything downstream).
DATA_TRAIN_CODE = [str(Path(os.path.relpath(workflow.basedir), "src", "gpulab", "data", f"{m}.py"))
                   for m in ("__init__", "api", "datasets", "errors", "formats", "train_sets")]
DATA_TRAIN_CFG = json.dumps({"stage": {"seed": config["data"]["seed"],
                                       "train": config["data"]["train"]}}, sort_keys=True)


rule data_train:
    input:
        code=DATA_TRAIN_CODE + [f"{SCRIPTS}/data_train.py"],
    output:
        digits=DATA_TRAIN_SETS["digits"],
        tabular=DATA_TRAIN_SETS["tabular"],
    params:
        cfg=DATA_TRAIN_CFG,
    resources:
        gpu=0,
    log:
        f"results/logs/data/{HOST}-train.log",
    shell:
        f"{PY} {SCRIPTS}/data_train.py --config-json {{params.cfg:q}} "
        "--digits {output.digits} --tabular {output.tabular} 2>&1 | tee {log}"


# The load benchmark: every dataset in every format, read back by every loader (CPU-only).
DATA_H5 = f"results/data/{HOST}/main.h5"
STAGE_RESULTS.append(DATA_H5)
# The user's own files (config data.inputs): inputs of the rule, so replacing one reruns it, and
# their headers/shapes checked now, so a bad one stops the run before any benchmark starts.
DATA_INPUTS = [item["path"] for item in config["data"]["inputs"]]
try:
    from gpulab.data.stage import external_inputs

    external_inputs(config["data"])
except ValueError as exc:
    raise WorkflowError(f"config data.inputs: {exc}") from None


rule data:
    input:
        code=stage_code("data"),
        inputs=DATA_INPUTS,
    output:
        h5=DATA_H5,
        files=directory(f"results/data/{HOST}/files"),
    params:
        cfg=stage_payload("data"),
        variant="main",
    # Ahead of the benchmarks: the rest of each file is checked here, before hours of GPU work.
    priority: 50
    resources:
        gpu=0,
    log:
        f"results/logs/data/{HOST}-main.log",
    shell:
        stage_shell("data", extra="--files-dir {output.files}")
