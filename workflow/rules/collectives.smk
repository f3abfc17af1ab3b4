# Collectives: library collectives over a size sweep (algbw/busbw as nccl-tests defines them), NCCL
# path variants (Ring, Tree, P2P off) and hand-written ring/tree/parameter-server all-reduce.
# One job per variant; each is one torchrun launch over all of the stage's GPUs (gloo on CPU).
COLLECTIVES_DIR = f"results/collectives/{HOST}"
# The NCCL path variants need GPUs: without them only the default job runs, and its result records
# them as not applicable.
COLLECTIVES_VARIANTS = config["collectives"]["variants"] if HOST_GPUS else ["default"]
COLLECTIVES_H5 = expand(f"{COLLECTIVES_DIR}/{{variant}}.h5", variant=COLLECTIVES_VARIANTS)
STAGE_RESULTS.extend(COLLECTIVES_H5)


# `snakemake --cores all collectives`: every variant of this host.
rule collectives:
    input:
        COLLECTIVES_H5,


rule collectives_variant:
    input:
        code=stage_code("collectives"),
    output:
        h5=report(f"{COLLECTIVES_DIR}/{{variant}}.h5", caption="../report/collectives.rst",
                  category="Collectives"),
    wildcard_constraints:
        variant="|".join(COLLECTIVES_VARIANTS),
    params:
        cfg=stage_payload("collectives"),
        variant="{variant}",
    resources:
        **slurm_resources("collectives"),
    log:
        f"results/logs/collectives/{HOST}/{{variant}}.log",
    shell:
        stage_shell("collectives", slots=gpus_for("collectives"))
