"""End-to-end Snakemake runs on CPU in a private copy of the workflow."""
import re

import pytest
import yaml

from conftest import planned_rules, snakemake
from gpulab import results

pytestmark = pytest.mark.e2e


def _set(workflow_dir, section, key, value):
    cfg_path = workflow_dir / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg.setdefault(section, {})[key] = value
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The README's main job (`snakemake --cores all`) run once in a private copy."""
    from conftest import copy_workflow

    wf = copy_workflow(tmp_path_factory.mktemp("run") / "wf")
    snakemake(wf, "--cores", "all", env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""})
    return wf


def test_main_job_produces_probe_and_report(finished_run):
    wf = finished_run
    probe = wf / "results" / "probe" / "testhost.h5"
    a = results.read_attrs(probe)
    assert a["stage"] == "probe" and a["has_gpus"] is False and a["device_kind"] == "cpu"
    assert "CPU side only" in (wf / "results/probe/testhost.md").read_text() or "none visible" in (
        wf / "results/probe/testhost.md").read_text()
    host = results.read_table(probe, "host")
    assert int(host.set_index("key").loc["logical_cpus", "value"]) >= 1
    html = (wf / "results/report/report.html").read_text()
    assert "System under test" in html and "Appendix: provenance" in html
    # Every real stage section rendered (a section that raises becomes an error box, counted here).
    assert 'name="gpulab-section-errors" content="0"' in html
    assert re.search(r'src="data:image/png;base64,', html) or "Table 1." in html
    assert not list(wf.glob("results/**/.*.tmp-*"))


def test_nothing_reruns_when_nothing_changed(finished_run):
    assert planned_rules(finished_run, env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""}) == {}


def test_config_change_reruns_only_that_stage_and_the_report(finished_run, tmp_path):
    from conftest import copy_workflow

    wf = finished_run
    cfg = wf / "config.yaml"
    original = cfg.read_text()
    try:
        _set(wf, "probe", "gpus", 1)
        plan = planned_rules(wf, env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""})
        # The stage, its chapter alone (one fragment), and the report that assembles the chapters.
        assert plan == {"probe": 1, "report_fragment": 1, "report": 1, "all": 1}, plan
        _set(wf, "report", "title", "another title")
        cfg.write_text(original)
        _set(wf, "report", "title", "another title")
        plan = planned_rules(wf, env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""})
        assert set(plan) == {"report", "all"}, plan
    finally:
        cfg.write_text(original)


def test_multinode_setting_reruns_only_the_multiprocess_stages(finished_run):
    from conftest import job_counts

    wf = finished_run
    cfg = wf / "config.yaml"
    original = cfg.read_text()
    try:
        _set(wf, "devices", "nodes", {"master_addr": "10.0.0.9"})
        p = snakemake(wf, "--cores", "2", "--dry-run",
                      env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""})
        out = p.stdout + p.stderr
        # data, probe, transfer, kernels and sort never read devices.nodes: their jobs stay done.
        assert set(job_counts(out)) == {"collectives_variant", "gemm", "train_variant", "report",
                                        "report_fragment", "all"}, out
        assert job_counts(out)["report_fragment"] == 3, out  # the chapters of those three stages
        # The rerun reason names the payload files, not the whole config slice.
        reasons = [line for line in out.splitlines() if "reason:" in line]
        assert reasons and all(len(line) < 400 for line in reasons), reasons
        assert "10.0.0.9" not in out
    finally:
        cfg.write_text(original)


def test_a_limit_change_reruns_the_stages_that_read_it_and_the_report(finished_run):
    """Issue 24: after a datasheet figure in limits.yaml was fixed, a plain snakemake said nothing
    to do and every stored verdict stayed stale. Code inputs are now computed from imports."""
    import os

    from gpulab import stages, workflow

    wf = finished_run
    readers = {s for s in stages.STAGES
               if any(p.endswith("src/gpulab/limits.yaml") for p in workflow.stage_code(s, wf))}
    # the stages whose bars or plausibility checks use datasheet limits (their jobs import
    # gpulab.limits)
    assert readers == {"transfer", "kernels", "gemm", "collectives"}, readers
    limits = wf / "src" / "gpulab" / "limits.yaml"
    text, st = limits.read_text(), limits.stat()
    try:
        limits.write_text(text + "\n# a datasheet figure fixed\n")
        plan = planned_rules(wf, env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""})
        # kernels_job/kernels_jobs: the kernels stage's other rules (workflow/rules/kernels.smk);
        # collectives_variant: collectives' rule. Every chapter's verdict lines read the limits
        # too (the report package's code), so the fragments re-render.
        assert set(plan) == {"transfer", "kernels", "kernels_job", "kernels_jobs", "gemm",
                             "collectives_variant", "report_fragment", "report", "all"}, plan
    finally:
        limits.write_text(text)
        os.utime(limits, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert planned_rules(wf, env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""}) == {}


def test_code_change_reruns_the_stage_it_touches(finished_run):
    wf = finished_run
    src = wf / "src" / "gpulab" / "probe" / "host.py"
    src.write_text(src.read_text() + "\n")
    plan = planned_rules(wf, env={"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""})
    assert plan == {"probe": 1, "report_fragment": 1, "report": 1, "all": 1}, plan


def test_bad_config_fails_with_file_line_and_key(workflow_dir):
    _cfg = workflow_dir / "config.yaml"
    _cfg.write_text(_cfg.read_text() + "\ndevices:\n  cpu_devices: zero\n")
    p = snakemake(workflow_dir, "--cores", "1", "--dry-run", check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert re.search(r"config\.yaml:\d+: key 'devices\.cpu_devices': 'zero' is not of type 'integer'", out), out


def test_stage_asking_for_more_gpus_than_host_has_is_an_error(workflow_dir):
    _set(workflow_dir, "probe", "gpus", 3)
    p = snakemake(workflow_dir, "--cores", "1", "--dry-run", check=False,
                  env={"GPULAB_GPU_POOL": "0,1"})
    assert p.returncode != 0
    assert "probe.gpus asks for 3 GPU(s) but this host has 2" in p.stdout + p.stderr


def test_stage_asking_for_more_than_the_gpu_resource_is_an_error(workflow_dir):
    p = snakemake(workflow_dir, "--cores", "1", "--dry-run", "--resources", "gpu=1", check=False,
                  env={"GPULAB_GPU_POOL": "0,1"})
    assert p.returncode != 0
    assert "probe.gpus asks for 2 GPU(s) but --resources gpu=1" in p.stdout + p.stderr


def test_every_number_the_pipeline_records_has_a_unit(finished_run):
    """One units table and a suffix rule (gpulab.outcomes.units_for) name the unit of every numeric
    or boolean column of every table the quick pipeline writes."""
    import pandas as pd

    from gpulab import outcomes

    missing = []
    for f in sorted((finished_run / "results").rglob("*.h5")):
        for name in results.list_contents(f)["tables"]:
            df = results.read_table(f, name)
            units = outcomes.units_for(df)
            missing += [f"{f.relative_to(finished_run)}:{name}:{c}" for c in df.columns
                        if len(df) and c not in units and (pd.api.types.is_numeric_dtype(df[c])
                                                           or pd.api.types.is_bool_dtype(df[c]))]
    assert not missing, missing
