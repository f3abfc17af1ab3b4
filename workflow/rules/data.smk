# Data loading: training sets for the training stage, and the CSV/JSON/HDF5 load benchmark.
# CPU-only (no GPU slot is held): loading is host work; host->device copies are the transfer stage.
DATA_TRAIN_SETS = {
    "digits": f"results/data/{HOST}/train/digits.h5",
    "tabular": f"results/data/{HOST}/train/tabular.h5",
}


rule data_train:
    input:
        code=stage_code("data") + [f"{SCRIPTS}/data_train.py"],
    output:
        digits=DATA_TRAIN_SETS["digits"],
        tabular=DATA_TRAIN_SETS["tabular"],
    params:
        cfg=stage_payload("data"),
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


rule data:
    input:
        code=stage_code("data"),
    output:
        h5=DATA_H5,
        files=directory(f"results/data/{HOST}/files"),
    params:
        cfg=stage_payload("data"),
        variant="main",
    resources:
        gpu=0,
    log:
        f"results/logs/data/{HOST}-main.log",
    shell:
        stage_shell("data", extra="--files-dir {output.files}")
