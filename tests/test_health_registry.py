"""Issue 26 item 1: a stage's part in health checks is declared in its StageSpec (hooks), and the
health/fleet wing iterates the registry: no stage list of its own, no import of a stage package."""
from __future__ import annotations

import ast
import os
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from gpulab import metrics as metmod
from gpulab import results, stages

SRC = Path(__file__).resolve().parents[1] / "src" / "gpulab"


def test_health_stages_and_node_results_come_from_the_specs():
    declared = [n for n, s in stages.STAGES.items() if s.health_variant]
    assert stages.health_stages() == declared and "probe" in declared
    res = stages.health_results("n7")
    assert set(res) == set(declared)
    for name, path in res.items():
        spec = stages.get(name)
        assert path == spec.path(spec.result, "n7", spec.health_variant) and "n7" in path


def test_every_metrics_hook_resolves_and_every_health_stage_gives_metrics():
    fns = metmod.extractors()
    assert set(fns) == {n for n, s in stages.STAGES.items() if s.metrics}
    assert set(stages.health_stages()) <= set(fns)
    assert all(callable(f) for f in fns.values())


@pytest.mark.parametrize("module", ["metrics.py", "fleet.py", "baseline.py", "cli.py", "report/fleet.py"])
def test_the_health_wing_imports_no_stage_package_and_names_no_stage(module):
    tree = ast.parse((SRC / module).read_text())
    imported = {a.name if isinstance(n, ast.Import) else f"{n.module}.{a.name}"
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    stage_pkgs = {f"gpulab.{s}" for s in stages.STAGES if s != "probe"}  # probe: its node-state reader
    assert not {i for i in imported for p in stage_pkgs if i == p or i.startswith(p + ".")}, imported
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & set(stages.STAGES), strings & set(stages.STAGES)


def test_a_new_stage_joins_health_and_the_fleet_view_by_its_spec_alone(tmp_path, monkeypatch):
    mod = types.ModuleType("tinymetrics")

    def extract(path, a, group):
        df = results.read_table(path, "numbers")
        return metmod.rows(group, a["host"], "tiny", "tiny/count", "1/s", metmod.HIGHER, df["rate"])

    mod.extract = extract
    monkeypatch.setitem(sys.modules, "tinymetrics", mod)
    spec = stages.StageSpec("tiny", "Tiny", gpus="none", tables=("numbers",),
                            metrics="tinymetrics:extract", health_variant="main")
    monkeypatch.setitem(stages.STAGES, "tiny", spec)
    assert stages.health_stages()[-1] == "tiny"
    assert stages.health_results("h1")["tiny"] == "results/tiny/h1/main.h5"
    from gpulab import fleet as fl

    for i, h in enumerate(["h1", "h2", "h3", "h4"]):
        r = results.Result("tiny", "main", {}, "cpu")
        rate = [10.0 + 0.01 * i, 10.1, 9.9] if h != "h3" else [2.0, 2.1, 1.9]
        r.add_table("numbers", pd.DataFrame({"rate": rate}))
        os.environ["GPULAB_HOST"] = h
        try:
            results.write(r, tmp_path / "tiny" / h / "main.h5")
        finally:
            del os.environ["GPULAB_HOST"]
    samples, _ = fl.prepare(results.find_results(tmp_path))
    assert set(samples["stage"]) == {"tiny"} and set(samples["cls"]) == {metmod.GATING}
    assert fl.flagged_hosts(fl.deviations(samples)) == {"cpu: CPU virtual devices": ["h3"]}


def test_config_checks_are_hooks_run_once_per_stage(monkeypatch):
    with pytest.raises(ValueError, match="module:function"):
        stages.hook("no_function_here")
    seen = []
    mod = types.ModuleType("tinycheck")
    mod.check = lambda section: seen.append(dict(section))
    monkeypatch.setitem(sys.modules, "tinycheck", mod)
    monkeypatch.setitem(stages.STAGES, "tiny", stages.StageSpec("tiny", "Tiny", config_check="tinycheck:check"))
    monkeypatch.setattr(stages, "hook", lambda ref: mod.check if ref == "tinycheck:check" else (lambda s: None))
    stages.check_configs({"tiny": {"n": 3}, "train": {}})
    assert seen == [{"n": 3}]
