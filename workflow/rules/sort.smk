# Multi-device sorting (issue 7): one job over all of its GPUs (or CPU virtual devices).
SORT_H5 = f"results/sort/{HOST}/main.h5"
STAGE_RESULTS.append(SORT_H5)


rule sort:
    input:
        code=stage_code("sort"),
    output:
        h5=SORT_H5,
    params:
        cfg=stage_payload("sort"),
        variant="main",
    resources:
        gpu=gpus_for("sort"),
    log:
        f"results/logs/sort/{HOST}/main.log",
    shell:
        stage_shell("sort")
