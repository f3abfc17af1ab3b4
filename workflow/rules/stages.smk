# One rule per stage of the registry (gpulab.stages.STAGES), generated from its spec: the stage's
# script on its config payload, with its GPUs, variants, extra inputs, outputs and arguments. A
# stage with more than one job shape adds its other rules in the file its spec names (`rules`).
# `snakemake <stage>` runs one stage: its job rule, or for a stage with variants a target rule over
# all of them (the job rule is then `<stage>_variant`).


for _spec in gpulab_stages.STAGES.values():

    rule:
        name:
            f"{_spec.name}_variant" if _spec.has_variants else _spec.name
        input:
            **stage_inputs(_spec.name),
            **{k: _spec.path(t, HOST) for k, t in _spec.inputs.items()},
            **(_spec.config_inputs(config) if _spec.config_inputs else {}),
        output:
            h5=stage_result(_spec),
            **{k: stage_output(_spec, k, t) for k, t in _spec.outputs.items()},
        wildcard_constraints:
            **({"variant": "|".join(_spec.variants(config, HOST_GPUS))} if _spec.has_variants else {}),
        params:
            payload=stage_payload(_spec.name),
            variant="{variant}" if _spec.has_variants else "main",
            entry=stage_entry(_spec.name),
            args=stage_args(_spec),
            slots=gpus_for(_spec.name),
        priority: _spec.priority
        threads: stage_threads(_spec)
        resources:
            **(slurm_resources(_spec.name) if _spec.multiprocess else {"gpu": gpus_for(_spec.name)}),
            host_quiet=host_quiet(_spec.name),
        log:
            stage_log(_spec),
        shell:
            stage_shell(extra="{params.args}", slots="{params.slots}")

    if _spec.has_variants:

        rule:
            name:
                _spec.name
            input:
                _spec.final_results(config, HOST, HOST_GPUS),

    if _spec.rules:

        include: str(Path(workflow.basedir, _spec.rules))


# The results the report reads (config report.stages, default every stage): `snakemake` runs these.
STAGE_RESULTS = [f for s in (config["report"]["stages"] or gpulab_stages.ORDER)
                 for f in gpulab_stages.get(s).final_results(config, HOST, HOST_GPUS)]
