# Health checks over a fleet (issue 19): the stage filter of a preset, the `health` target,
# baselines (`baseline_save`, `compare`), the fleet view, and one health job per cluster node.
# Included from the Snakefile after the stage rule files and before report.smk, because it
# narrows STAGE_RESULTS (what rule all and the report ask for) to the enabled stages.
FLEET = config["fleet"]
# The stages whose StageSpec names a health variant (gpulab.stages.health_stages).
HEALTH_STAGES = gpulab_stages.health_stages()




# Cluster mode: the fleet is the listed nodes, each measured by one job pinned to it; the host that
# runs snakemake (a login node) measures nothing itself.
FLEET_NODES = list(FLEET["nodes"])
if FLEET_NODES:
    STAGE_RESULTS[:] = [p for n in FLEET_NODES for p in node_results(n).values()]
BASELINE = FLEET["baseline"]
BASELINE_JSON = f"results/baseline/{HOST}/{BASELINE}.json" if BASELINE else None
if BASELINE_JSON:
    # The report's "Against baseline" section reads it, so the report follows the comparison.
    STAGE_RESULTS.append(BASELINE_JSON)

localrules: health, fleet, baseline_save, compare


# `snakemake --cores all health`: this host's health results (in cluster mode: every node's), without
# the other stages, whatever the config's `stages` says.
rule health:
    input:
        [p for p in STAGE_RESULTS if _stage_of(p) in HEALTH_STAGES],


if FLEET_NODES:

    # One job per node, pinned to it with --nodelist; the stage scripts label results with
    # GPULAB_HOST so they land under results/<stage>/<node>/ like a local run of that node.
    rule health_node:
        output:
            **node_results("{node}"),
        wildcard_constraints:
            node="|".join(FLEET_NODES),
        params:
            **{s: stage_payload(s) for s in HEALTH_STAGES},
        resources:
            gpu=HOST_GPUS,
            runtime=FLEET["node_runtime"],
            cpus_per_task=max(4, 2 * HOST_GPUS),
            # appended to sbatch as it is: pin the job to its node, alone there
            slurm_extra=lambda wc: f"--nodelist={wc.node} --exclusive",
        log:
            "results/logs/health/{node}.log",
        shell:
            "( export GPULAB_HOST={wildcards.node} && "
            + " && ".join(fleet_node_cmd(s) for s in HEALTH_STAGES)
            + " ) 2>&1 | tee {log}"

    # A listed node that is also this host: its own job, not the per-stage rules (the job rule of
    # a stage with variants is `<stage>_variant`, see stages.smk).
    for _s in HEALTH_STAGES:
        workflow.ruleorder("health_node", f"{_s}_variant" if gpulab_stages.get(_s).has_variants else _s)


# `snakemake fleet`: the fleet view as text (the report shows it with a heatmap).
rule fleet:
    input:
        STAGE_RESULTS,
    output:
        txt="results/fleet/fleet.txt",
        csv="results/fleet/deviations.csv",
    params:
        args=f"--threshold {FLEET['z_threshold']} --mad-floor {FLEET['mad_floor']} "
             f"--min-hosts {FLEET['min_hosts']}",
        py=PY,
    log:
        "results/logs/fleet/fleet.log",
    shell:
        "{params.py} -m gpulab.cli fleet --results-dir results {params.args} --csv {output.csv} "
        "2> {log} | tee {output.txt}"


RESULTS_NO_JSON = [p for p in STAGE_RESULTS if p != BASELINE_JSON]

if BASELINE:

    # `snakemake baseline_save --config 'fleet={"baseline": "NAME"}'`: baselines/NAME.yaml from
    # this host's results (never replaced: delete the file, or `gpulab baseline save --force`).
    rule baseline_save:
        input:
            RESULTS_NO_JSON,
        output:
            f"baselines/{BASELINE}.yaml",
        params:
            py=PY, name=BASELINE, host=HOST,
        log:
            f"results/logs/baseline/{HOST}/save.log",
        shell:
            "{params.py} -m gpulab.cli baseline save {params.name} --results-dir results "
            "--host {params.host} 2>&1 | tee {log}"

    rule baseline_json:
        input:
            results=RESULTS_NO_JSON,
            baseline=f"baselines/{BASELINE}.yaml",
        output:
            BASELINE_JSON,
        params:
            py=PY, name=BASELINE, host=HOST, tolerance=FLEET["tolerance"], k=FLEET["spread_k"],
        log:
            f"results/logs/baseline/{HOST}/json.log",
        shell:
            "{params.py} -m gpulab.cli compare {params.name} --results-dir results --host {params.host} "
            "--tolerance {params.tolerance} --k {params.k} --json {output} --exit-zero --changes-only 2>&1 | tee {log}"

    # `snakemake compare --config 'fleet={"baseline": "NAME"}'`: fails on a regression (cron, CI).
    # No output, so it runs every time it is asked for.
    rule compare:
        input:
            BASELINE_JSON,
        params:
            py=PY, name=BASELINE, host=HOST, tolerance=FLEET["tolerance"], k=FLEET["spread_k"],
        log:
            f"results/logs/baseline/{HOST}/compare.log",
        shell:
            "{params.py} -m gpulab.cli compare {params.name} --results-dir results --host {params.host} "
            "--tolerance {params.tolerance} --k {params.k} 2>&1 | tee {log}"

else:
    _NO_BASELINE = ("gpulab: name the baseline: --config 'fleet={\"baseline\": \"NAME\"}' "
                    "(file baselines/NAME.yaml)")

    rule baseline_save:
        params:
            why=_NO_BASELINE,
        log:
            "results/logs/baseline/baseline_save-unnamed.log",
        shell:
            "echo {params.why:q} >&2; exit 1"

    rule compare:
        params:
            why=_NO_BASELINE,
        log:
            "results/logs/baseline/compare-unnamed.log",
        shell:
            "echo {params.why:q} >&2; exit 1"
