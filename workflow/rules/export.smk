# `snakemake --cores all export`: every result of this run as one tidy long table (Parquet, CSV,
# JSON Lines; gpulab.export), beside the report. Logic lives in the package (`gpulab export`).
EXPORT_STEM = "results/export/results"

localrules: export


rule export:
    input:
        [p for p in STAGE_RESULTS if p.endswith(".h5")],
    output:
        parquet=f"{EXPORT_STEM}.parquet",
        csv=f"{EXPORT_STEM}.csv",
        jsonl=f"{EXPORT_STEM}.jsonl",
    log:
        "results/logs/export/export.log",
    shell:
        f"{PY} -m gpulab.cli export --results-dir results --out {EXPORT_STEM} 2>&1 | tee {{log}}"
