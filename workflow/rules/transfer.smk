# Transfer benchmarks: P2P matrices, host <-> device, hybrid split, cudaMalloc cost, host memcpy.
TRANSFER_H5 = f"results/transfer/{HOST}/main.h5"
STAGE_RESULTS.append(TRANSFER_H5)


rule transfer:
    input:
        code=stage_code("transfer"),
    output:
        h5=TRANSFER_H5,
    params:
        cfg=stage_payload("transfer"),
        variant="main",
    resources:
        gpu=gpus_for("transfer"),
        host_quiet=host_quiet("transfer"),
    log:
        f"results/logs/transfer/{HOST}/main.log",
    shell:
        stage_shell("transfer")
