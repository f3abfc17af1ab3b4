# Training sweeps: single device / DataParallel / naive model parallel (one process), DDP,
# pipeline and tensor parallel (torchrun ranks: one per GPU, or cpu_devices gloo ranks on CPU).
TRAIN_VARIANTS = config["train"]["variants"]
TRAIN_H5 = [f"results/train/{HOST}/{v}.h5" for v in TRAIN_VARIANTS]
STAGE_RESULTS.extend(TRAIN_H5)
# Every rank is a busy process: on CPU the job takes as many cores as it has ranks.
TRAIN_RANKS = gpus_for("train") or config["devices"]["cpu_devices"]


rule train:  # target: every variant (`snakemake --cores all train`)
    input:
        TRAIN_H5,


rule train_variant:
    input:
        code=stage_code("train"),
        digits=DATA_TRAIN_SETS["digits"],
    output:
        h5=f"results/train/{HOST}/{{variant}}.h5",
    wildcard_constraints:
        variant="|".join(TRAIN_VARIANTS),
    params:
        cfg=stage_payload("train"),
        variant="{variant}",
    threads: TRAIN_RANKS
    resources:
        **slurm_resources("train"),
    log:
        f"results/logs/train/{HOST}/{{variant}}.log",
    shell:
        stage_shell("train", extra="--data {input.digits}", slots=gpus_for("train"))
