# Hardware probe: the system under test, once per host.
PROBE_H5 = f"results/probe/{HOST}.h5"
STAGE_RESULTS.append(PROBE_H5)


rule probe:
    input:
        code=stage_code("probe"),
    output:
        h5=PROBE_H5,
        json=f"results/probe/{HOST}.json",
        md=f"results/probe/{HOST}.md",
    params:
        cfg=stage_payload("probe"),
        variant="main",
    resources:
        gpu=gpus_for("probe"),
    log:
        f"results/logs/probe/{HOST}.log",
    shell:
        stage_shell("probe")
