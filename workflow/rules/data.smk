# Data beyond its generated rule (the CSV/JSON/HDF5 load benchmark): the training sets for the
# training stage. CPU-only (no GPU slot is held): loading is host work.
DATA_TRAIN_SETS = {
    "digits": f"results/data/{HOST}/train/digits.h5",
    "tabular": f"results/data/{HOST}/train/tabular.h5",
}


# Only the code and config that shape the training sets (the script and what it imports and reads,
# computed): editing or resizing the benchmark must not rebuild them (and so retrain downstream).
DATA_TRAIN_CODE = script_code("data_train")
# Generated datasets, content-addressed and reused across runs and hosts (gpulab.data.cache).
DATA_CACHE = "results/data/cache"


rule data_train:
    input:
        code=DATA_TRAIN_CODE,
    output:
        digits=DATA_TRAIN_SETS["digits"],
        tabular=DATA_TRAIN_SETS["tabular"],
    params:
        payload=write_payload("data_train", {"stage": {"seed": config["data"]["seed"],
                                                       "train": config["data"]["train"]}}),
    resources:
        gpu=0,
        host_quiet=host_quiet("data"),
    log:
        f"results/logs/data/{HOST}/train.log",
    shell:
        f"{PY} {SCRIPTS}/data_train.py --payload {{params.payload:q}} "
        f"--cache-dir {DATA_CACHE} --digits {{output.digits}} --tabular {{output.tabular}} "
        "2>&1 | tee {log}"


# The user's own files (config data.inputs) are inputs of the data rule (its spec's config_inputs),
# so replacing one reruns it; their headers/shapes are checked now, so a bad one stops the run
# before any benchmark starts.
try:
    from gpulab.data.loaders import external_inputs
    from gpulab.data.settings import Settings as DataSettings

    external_inputs(DataSettings.from_section(config["data"]))
except ValueError as exc:
    raise WorkflowError(f"config data.inputs: {exc}") from None
