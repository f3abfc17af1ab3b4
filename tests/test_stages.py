"""The stage registry is the one place stages are declared: schemas, rules, payloads, report order."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_workflow, job_counts, snakemake
from gpulab import config, stages
from gpulab.report import sections

PLOTTING = ("matplotlib", "seaborn")


def test_top_level_schema_has_a_property_per_registered_stage_and_no_other():
    sch = config.schema()
    assert set(stages.STAGES) <= set(sch["properties"])
    assert set(sch["properties"]) - set(stages.STAGES) == {"host_label", "devices", "report", "quiet_host", "fleet"}
    assert sch["$defs"]["stage_name"]["enum"] == stages.ORDER
    cfg = config.validate({})
    assert all(isinstance(cfg[s], dict) for s in stages.STAGES)  # each section got its defaults


def test_report_stages_names_only_registered_stages():
    assert config.validate({"report": {"stages": ["probe"]}})["report"]["stages"] == ["probe"]
    with pytest.raises(config.ConfigError, match=r"key 'report\.stages\[0\]': 'probes' is not one"):
        config.validate({"report": {"stages": ["probes"]}})


def test_payload_holds_the_section_and_only_the_devices_keys_the_stage_reads():
    cfg = config.validate({"devices": {"nodes": {"nnodes": 2}}})
    data = stages.get("data").payload(cfg)
    assert data["stage"] == cfg["data"] and "nodes" not in data["devices"]
    assert data["devices"] == {k: cfg["devices"][k] for k in stages.SINGLE_PROCESS_KEYS}
    assert stages.get("gemm").payload(cfg)["devices"]["nodes"]["nnodes"] == 2
    assert data["validated"] is True


def test_a_validated_payload_is_not_validated_again_but_one_by_hand_is(tmp_path):
    from gpulab import stage

    args = stage.parse_args("probe", None, ["--out", str(tmp_path / "p.h5"), "--payload",
                                            str(tmp_path / "payload.json")])
    (tmp_path / "payload.json").write_text(json.dumps({"stage": {}}))
    assert stage.context_from_args("probe", args).config == {"gpus": "all"}  # defaults filled in
    (tmp_path / "payload.json").write_text(json.dumps({"stage": {}, "validated": True}))
    assert stage.context_from_args("probe", args).config == {}


def test_report_order_and_section_modules_come_from_the_registry():
    assert sections.ORDER == stages.ORDER == list(stages.STAGES)
    for spec in stages.STAGES.values():
        mod = sections.module_for(spec.name)
        assert mod is not None and mod.__name__ == spec.section_module(), spec.name


@pytest.mark.slow
def test_schemas_are_read_from_an_installed_wheel(tmp_path):
    """Built from a copy (pip builds in the source tree) and imported straight from the zip."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for part in ("pyproject.toml", "README.md", "src"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(REPO / part, pkg / part)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(pkg)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("gpulab-*.whl"))
    code = textwrap.dedent("""
        import gpulab
        from gpulab import config
        assert gpulab.__file__.startswith(%r), gpulab.__file__
        cfg = config.validate({})
        print(cfg["train"]["pipeline_batch"], config.validate_section("probe", {})["gpus"])
    """ % str(wheel))
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": str(wheel), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(config.validate({})["train"]["pipeline_batch"]), "all"]


def _imported_at_parse_time(stderr: str) -> set[str]:
    """Top-level modules a `python -X importtime` run imported."""
    return {line.split("|")[-1].strip().split(".")[0] for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.slow
def test_lint_parses_without_the_plotting_stack_and_finds_only_the_conda_advice(workflow_dir):
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "--lint"],
                       cwd=workflow_dir, capture_output=True, text=True, timeout=300,
                       env={**_env(workflow_dir), "GPULAB_GPU_POOL": ""})
    imported = _imported_at_parse_time(p.stderr)
    assert "snakemake" in imported and "gpulab" in imported  # the probe works
    assert not imported & set(PLOTTING), imported & set(PLOTTING)
    # Nor torch (~2 s at every Snakemake start, dry runs included): the parse-time checks of the
    # train config and of the user's input files need none of it.
    assert "torch" not in imported
    # (`--lint json` is not passed on by Snakemake's command line, hence the text.)
    titles = set(re.findall(r"^    \* (.+):$", p.stdout + p.stderr, re.M))
    assert "Specify a conda environment or container for each rule." in titles  # lint ran
    # A pinned virtual environment is this project's deployment, not conda: that advice stays.
    assert titles == {"Specify a conda environment or container for each rule."}, titles


def _env(wf: Path) -> dict:
    return {**os.environ, "GPULAB_HOST": "testhost", "GPULAB_SLOT_DIR": str(wf / ".slots")}


TINY_INIT = '''\
"""Tiny: counts to n (a stage added by a test)."""
import pandas as pd


def run(ctx):
    result = ctx.new_result("cpu")
    result.add_table("numbers", pd.DataFrame({"n": range(ctx.config["n"])}))
    return result
'''
TINY_SCHEMA = '''\
$schema: "https://json-schema.org/draft/2020-12/schema"
type: object
additionalProperties: false
properties:
  n: {type: integer, minimum: 1, default: 3, description: how far to count}
'''
TINY_SECTION = '''\
from gpulab import results

TITLE = "Tiny counting"
METHODS = "<p>Counts.</p>"


def render(files, figs):
    return "".join(f"<p>tiny counted {len(results.read_table(f, 'numbers'))}</p>" for f in files)


def headlines(files):
    return ["Tiny counted."]
'''

# Its health metric (gpulab.metrics): the count, as a gating metric of baselines and the fleet view.
TINY_METRICS = '''\
from gpulab import metrics as m
from gpulab import results


def extract(path, a, group):
    n = len(results.read_table(path, "numbers"))
    return m.rows(group, a["host"], "tiny", "tiny/count", "count", m.HIGHER, [n, n, n])
'''


@pytest.fixture(scope="module")
def tiny_stage(tmp_path_factory):
    """A copy of the workflow with one more stage: its package (code, schema.yaml, section.py, the
    health metric), its spec entry and its place in the health preset, nothing else."""
    wf = copy_workflow(tmp_path_factory.mktemp("tiny") / "wf")
    pkg = wf / "src" / "gpulab" / "tiny"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(TINY_INIT)
    (pkg / "schema.yaml").write_text(TINY_SCHEMA)
    (pkg / "section.py").write_text(TINY_SECTION)
    (pkg / "metrics.py").write_text(TINY_METRICS)
    registry = wf / "src" / "gpulab" / "stages.py"
    text = registry.read_text()
    assert text.count("\n]}\n") == 1
    registry.write_text(text.replace(
        "\n]}\n", '\n    StageSpec("tiny", "Tiny", gpus="none", tables=("numbers",), '
        'metrics="gpulab.tiny.metrics:extract", health_variant="main"),\n]}\n'))
    preset = wf / "workflow" / "presets" / "health.yaml"
    cfg = yaml.safe_load(preset.read_text())
    cfg["report"]["stages"].append("tiny")
    preset.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return wf


@pytest.mark.e2e
def test_a_registered_stage_gets_its_rule_schema_section_and_place_in_the_report(tiny_stage):
    wf = tiny_stage
    env = {**_env(wf), "GPULAB_GPU_POOL": "", "PYTHONPATH": str(wf / "src")}
    # Its place in the report order and its own section module, from the registry alone.
    p = subprocess.run([sys.executable, "-c", "from gpulab.report import sections as s; "
                        "print(s.ORDER[-1], s.Section.load('tiny').module.__name__)"],
                       cwd=wf, capture_output=True, text=True, env=env)
    assert p.stdout.split() == ["tiny", "gpulab.tiny.section"], p.stderr
    # Its rule: in the plan of `snakemake` (the report reads it) and a target of its own. Its
    # section is the report's code, not the stage's: editing it reruns only its chapter (its
    # report fragment) and the report.
    out = snakemake(wf, "--cores", "1", "--dry-run", env=env).stdout
    assert job_counts(out)["tiny"] == 1
    inputs = dict(re.findall(r"^(?:local)?rule (\w+):\n\s+input: ([^\n]*)", out, re.M))
    assert "src/gpulab/tiny/schema.yaml" in inputs["tiny"]
    fragments = re.findall(r"^(?:local)?rule report_fragment:\n\s+input: ([^\n]*)", out, re.M)
    assert "section.py" not in inputs["tiny"] and "section.py" not in inputs["report"]
    assert sum("src/gpulab/tiny/section.py" in i for i in fragments) == 1  # tiny's chapter only
    assert job_counts(snakemake(wf, "--cores", "1", "--dry-run", "tiny", env=env).stdout) == {
        "tiny": 1}
    # Its schema: defaults in the job's payload, and a bad value named at its file:line and key.
    cfg_path = wf / "config.yaml"
    original = cfg_path.read_text()
    cfg_path.write_text(original + "\ntiny:\n  n: zero\n")
    p = snakemake(wf, "--cores", "1", "--dry-run", check=False, env=env)
    assert re.search(r"config\.yaml:\d+: key 'tiny\.n': 'zero' is not of type 'integer'",
                     p.stdout + p.stderr), p.stdout + p.stderr
    cfg = yaml.safe_load(original)
    cfg.setdefault("report", {})["stages"] = ["tiny"]
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake(wf, "--cores", "2", env=env)
    payload = json.loads(next((wf / "results" / "payloads").glob("tiny-*.json")).read_text())
    assert payload["stage"] == {"n": 3}
    html = (wf / "results" / "report" / "report.html").read_text()
    assert "Tiny counting" in html and "tiny counted 3" in html
    assert 'name="gpulab-section-errors" content="0"' in html
    # Health checks (issue 26: five places in all): its metric in baselines and the fleet view, its
    # job in the `health` target and the health preset, from the spec's hooks alone.
    p = subprocess.run([sys.executable, "-c", "from gpulab import metrics; "
                        "d = metrics.find('results'); "
                        "print(sorted(set(d[d.stage == 'tiny'].metric + ':' + d.cls)))"],
                       cwd=wf, capture_output=True, text=True, env=env)
    assert p.stdout.strip() == "['tiny/count:gating']", p.stdout + p.stderr
    fleet = subprocess.run([sys.executable, "-m", "gpulab", "fleet", "--results-dir", "results"],
                           cwd=wf, capture_output=True, text=True, env=env)
    # (the fleet view counts metrics per GPU model: tiny's is the one metric of this run)
    assert "1 host(s): testhost; 1 metrics" in fleet.stdout, fleet.stdout + fleet.stderr
    for target in ("health", "all"):
        plan = job_counts(snakemake(wf, target, "--cores", "1", "--dry-run", "--forceall",
                                    "--configfile", "workflow/presets/health.yaml", env=env).stdout)
        assert plan.get("tiny") == 1, (target, plan)
