# Multi-device GEMM: torch.matmul baseline, 1D row, SUMMA, overlapped SUMMA; strong scaling.
GEMM_H5 = f"results/gemm/{HOST}/main.h5"
STAGE_RESULTS.append(GEMM_H5)


rule gemm:
    input:
        code=stage_code("gemm"),
    output:
        h5=report(GEMM_H5, caption="../report/gemm.rst", category="GEMM"),
    params:
        cfg=stage_payload("gemm"),
        variant="main",
    resources:
        **slurm_resources("gemm"),
    log:
        f"results/logs/gemm/{HOST}/main.log",
    shell:
        stage_shell("gemm", slots=gpus_for("gemm"))
