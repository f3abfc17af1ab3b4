"""The report kit (gpulab.kit) sits below the stages: it imports nothing of gpulab above results and
outcomes, and every report section builds with it (issue 26)."""
from __future__ import annotations

import ast
from pathlib import Path

import gpulab
from gpulab import kit, stages

SRC = Path(gpulab.__file__).parent
ALLOWED = {"gpulab.results", "gpulab.outcomes"}


def _gpulab_imports(path: Path) -> set[str]:
    """Every gpulab module a file imports, at any depth of its code (a function's import counts)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "gpulab"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "gpulab":
            # "from gpulab import results" names the module results; "from gpulab.x import f", x
            found |= ({f"gpulab.{a.name}" for a in node.names} if node.module == "gpulab"
                      else {node.module})
    return found


def test_the_kit_imports_nothing_above_results():
    files = sorted(Path(kit.__file__).parent.glob("*.py"))
    assert {f.stem for f in files} >= {"__init__", "html", "frames"}
    for f in files:
        above = {m for m in _gpulab_imports(f) if m not in ALLOWED and not m.startswith("gpulab.kit")}
        assert not above, f"{f.name} imports {sorted(above)}: the kit sits below the stages"


def test_import_scan_sees_a_late_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from gpulab import results, outcomes\n\ndef g():\n    from gpulab.report import chapters\n"
                 "    import gpulab.stages\n")
    assert _gpulab_imports(f) == {"gpulab.results", "gpulab.outcomes", "gpulab.report", "gpulab.stages"}


def test_every_section_builds_with_the_kit_and_none_with_the_report_package():
    modules = [spec.section_module() for spec in stages.STAGES.values()] + ["gpulab.report.sections.generic"]
    for name in modules:
        path = SRC.joinpath(*name.split(".")[1:]).with_suffix(".py")
        imports = _gpulab_imports(path)
        assert any(m.startswith("gpulab.kit") for m in imports), f"{name} does not use the kit"
        if not name.startswith("gpulab.report."):  # a stage's own section: below the report
            assert not any(m.startswith("gpulab.report") for m in imports), name


def test_host_labels_name_the_devices_each_stage_counts():
    from gpulab.kit.frames import failed_suffix, host_kind, host_label

    gpu = {"host": "h200", "device_kind": "cuda", "world_size": 2, "device_name": "NVIDIA H200"}
    assert host_label(gpu, "world_size", cpu="{n} gloo ranks on CPU") == "h200 (2x NVIDIA H200)"
    named = {"host": "h200", "device_kind": "cuda", "n_devices": 4, "device_names": ["NVIDIA H200"] * 4}
    assert host_label(named, "n_devices", cpu="{n} CPU virtual dev.") == "h200 (4x NVIDIA H200)"
    cpu = {"host": "box", "device_kind": "cpu", "n_devices": 3}
    assert host_label(cpu, "n_devices", cpu="CPU, {n} virtual devices") == "box (CPU, 3 virtual devices)"
    assert host_label({"host": "x", "device_kind": "cuda"}, "n_devices", "", unnamed="?") == "x (?x ?)"
    assert host_kind(cpu) == "box (cpu)"
    assert failed_suffix({"verdict": "pass"}) == ""
    assert failed_suffix({"verdict": "fail", "verdict_summary": "1 failed"}) == " FAILED: 1 failed."


def test_collect_tagged_leads_each_files_rows_with_its_tags(tmp_path):
    import pandas as pd

    from gpulab import results
    from gpulab.kit.frames import collect_tagged

    files = []
    for host, rows in (("a", [1.0, 2.0]), ("b", []), ("c", [3.0])):
        r = results.Result("fakebench", "main", {}, "cpu")
        r.attrs["host"] = host
        r.add_table("t", pd.DataFrame({"x": rows}, dtype=float))
        files.append(results.write(r, tmp_path / f"{host}.h5"))
    pairs = [(f, results.read_attrs(f)) for f in files]
    df = collect_tagged(pairs, "t", lambda a: {"host": a["host"], "variant": a["variant"]})
    assert df.columns.tolist() == ["host", "variant", "x"]
    assert df["host"].tolist() == ["a", "a", "c"] and df["x"].tolist() == [1.0, 2.0, 3.0]
    assert collect_tagged(pairs, "t", lambda a: {"host": a["host"]}, keep_empty=True)["x"].notna().all()
    assert collect_tagged(pairs, "missing", lambda a: {}).empty


def test_the_plotting_stack_loads_seaborn_without_scipy_and_leaves_scipy_importable():
    """What every report job saves: seaborn's optional scipy.stats import (~1 CPU-second). In a
    fresh interpreter, as a report job starts: Agg backend, seaborn on its scipy-free path, and a
    later ``import scipy.stats`` (gpulab.baseline's test) still works. And when scipy.stats is
    already loaded, seaborn is imported as usual (nothing to save, nothing hidden)."""
    import subprocess
    import sys

    probe = ("import sys; from gpulab.kit.plotting import plt, sns; import matplotlib; "
             "import seaborn._statistics as st; "
             "print(matplotlib.get_backend().lower(), 'scipy.stats' in sys.modules, st._no_scipy); "
             "import scipy.stats; print(callable(scipy.stats.mannwhitneyu))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["agg", "False", "True", "True"], out.stdout + out.stderr
    first = "import scipy.stats; " + probe
    out = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, check=True)
    assert out.stdout.split()[:3] == ["agg", "True", "False"], out.stdout + out.stderr
