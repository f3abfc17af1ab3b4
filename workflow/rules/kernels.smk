# Kernels beyond its generated rule (the divide kernel and its split over devices, one job holding
# all the stage's GPUs): K independent one-GPU kernel jobs that Snakemake and gpulab-slot spread
# over the GPUs, and an aggregation showing where and when they ran.
KERNELS_DIR = f"results/kernels/{HOST}"
KERNELS_JOBS = list(range(config["kernels"]["jobs"]["count"]))
# One GPU per independent job where the host has GPUs; none (CPU kernel, no ids) where it has not.
KERNELS_JOB_GPUS = min(1, HOST_GPUS)


rule kernels_job:
    input:
        **stage_inputs("kernels"),
    output:
        h5=f"{KERNELS_DIR}/job{{i}}.h5",
    wildcard_constraints:
        i=r"\d+",
    params:
        payload=stage_payload("kernels"),
        entry=stage_entry("kernels"),
        variant="job{i}",
    resources:
        gpu=KERNELS_JOB_GPUS,
        # The K jobs are one measurement meant to overlap: each holds 1/K of the host, so they run
        # together and no other timing or CPU-heavy job runs beside any of them.
        host_quiet=host_quiet("kernels", share=len(KERNELS_JOBS)),
    log:
        f"results/logs/kernels/{HOST}/job{{i}}.log",
    shell:
        stage_shell()


rule kernels_jobs:
    input:
        **stage_inputs("kernels"),
        jobs=expand(f"{KERNELS_DIR}/job{{i}}.h5", i=KERNELS_JOBS),
    output:
        h5=f"{KERNELS_DIR}/jobs.h5",
    params:
        payload=stage_payload("kernels"),
        entry=stage_entry("kernels"),
        variant="jobs",
    resources:
        gpu=0,
    log:
        f"results/logs/kernels/{HOST}/jobs.log",
    shell:
        stage_shell(extra="--jobs {input.jobs}")
