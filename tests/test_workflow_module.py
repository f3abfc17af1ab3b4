"""gpulab.workflow without Snakemake: code inputs by import analysis, host sharing, GPU counts, the
parse-time side effects and the jobs' environment."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpulab import code_inputs, stages, workflow

REPO = Path(__file__).resolve().parents[1]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def _names(paths, root):
    return sorted(str(Path(p).resolve().relative_to(root.resolve())) for p in paths)


def test_closure_follows_imports_lazy_and_relative_and_the_data_files_read(tmp_path):
    root = _tree(tmp_path, {
        "src/gpulab/__init__.py": '"""pkg"""\n',
        "src/gpulab/a.py": "from gpulab import b\nimport numpy\n",
        "src/gpulab/b.py": "def f():\n    from .c import g\n    return g\n",
        "src/gpulab/c.py": "NAME = 'tables.yaml'\ndef g():\n    pass\n",
        "src/gpulab/tables.yaml": "x: 1\n",
        # named only in a docstring: cited, not read
        "src/gpulab/d.py": '"""reads nothing: see other.yaml"""\n',
        "src/gpulab/other.yaml": "y: 2\n",
        "src/gpulab/unused.py": "",
        "scripts/run.py": "from gpulab.a import x\n",
    })
    got = _names(code_inputs.code_closure([root / "scripts/run.py"], root / "src"), root)
    assert got == ["scripts/run.py", "src/gpulab/__init__.py", "src/gpulab/a.py", "src/gpulab/b.py",
                   "src/gpulab/c.py", "src/gpulab/tables.yaml"]
    assert _names(code_inputs.code_closure([root / "src/gpulab/d.py"], root / "src"), root) == [
        "src/gpulab/__init__.py", "src/gpulab/d.py"]


def test_a_suffix_names_every_file_ending_in_it_but_a_bare_extension_names_none(tmp_path):
    root = _tree(tmp_path, {
        "src/gpulab/__init__.py": "",
        "src/gpulab/cfg.py": "S = '.schema.yaml'\nif x.endswith('.yaml'):\n    pass\n",
        "src/gpulab/top.schema.yaml": "",
        "src/gpulab/limits.yaml": "",
    })
    got = _names(code_inputs.code_closure([root / "src/gpulab/cfg.py"], root / "src"), root)
    assert got == ["src/gpulab/__init__.py", "src/gpulab/cfg.py", "src/gpulab/top.schema.yaml"]


def test_a_parent_package_counts_by_its_module_level_code_only(tmp_path):
    root = _tree(tmp_path, {
        "src/gpulab/__init__.py": "",
        "src/gpulab/pkg/__init__.py": "from gpulab.pkg import light\ndef run():\n"
                                      "    from gpulab.pkg import heavy\n",
        "src/gpulab/pkg/light.py": "",
        "src/gpulab/pkg/heavy.py": "",
        "src/gpulab/pkg/api.py": "",
        "scripts/a.py": "from gpulab.pkg import api\n",  # pkg runs as a parent only
        "scripts/b.py": "from gpulab.pkg import run\n",  # pkg used by name: whole
    })
    a = _names(code_inputs.code_closure([root / "scripts/a.py"], root / "src"), root)
    b = _names(code_inputs.code_closure([root / "scripts/b.py"], root / "src"), root)
    assert "src/gpulab/pkg/light.py" in a and "src/gpulab/pkg/heavy.py" not in a
    assert "src/gpulab/pkg/heavy.py" in b


def test_training_sets_and_training_do_not_depend_on_the_data_benchmark():
    """Issue 28: train reads data/<host>/train/digits.h5; neither it nor the rule writing that file
    may rerun (or wait) because the load benchmark's code changed."""
    bench = {"src/gpulab/data/bench.py", "src/gpulab/data/loaders.py", "src/gpulab/data/stage.py"}
    train_sets = {Path(p).relative_to(REPO).as_posix()
                  for p in workflow.script_code("data_train", REPO)}
    assert "src/gpulab/data/train_sets.py" in train_sets and not bench & train_sets
    train = _stage_code("train")
    assert "src/gpulab/data/api.py" in train and not bench & train


def _stage_code(stage):
    return {Path(p).relative_to(REPO).as_posix() for p in workflow.stage_code(stage, REPO)}


def test_the_real_stages_code_inputs_reach_what_they_import_and_read():
    gemm = _stage_code("gemm")
    # the verdict logic and the datasheet figures the GEMM bars use (issue 24: a plain snakemake
    # said nothing to do after limits.yaml changed)
    assert {"src/gpulab/limits.py", "src/gpulab/limits.yaml", "src/gpulab/outcomes.py",
            "src/gpulab/config.py", "src/gpulab/lifetime.py", "src/gpulab/gemm/schema.yaml",
            "scripts/gemm.py"} <= gemm
    # its report section is the report's code, not the job's; other stages' files are not its own
    assert "src/gpulab/gemm/section.py" not in gemm
    assert not any(p.startswith("src/gpulab/transfer/") for p in gemm)
    assert "src/gpulab/p2pBandwidthLatencyTest_a5000.txt" in _stage_code("transfer")
    # the data stage reads no datasheet: changing one must not rerun it
    assert "src/gpulab/limits.yaml" not in _stage_code("data")
    assert "src/gpulab/limits.yaml" not in _stage_code("probe")


def test_which_stages_read_limits_is_computed_from_their_imports():
    readers = {s for s in stages.STAGES if "src/gpulab/limits.yaml" in _stage_code(s)}
    # every stage whose job code imports gpulab.limits, and no other
    importers = {s for s in stages.STAGES
                 if any(p.endswith("/limits.py") for p in _stage_code(s))}
    assert readers == importers and readers and readers != set(stages.STAGES), readers


def test_report_code_covers_sections_and_what_they_read():
    rep = {Path(p).relative_to(REPO).as_posix() for p in workflow.report_code(REPO)}
    for spec in stages.STAGES.values():
        f = workflow.section_file(spec, REPO)
        if f.is_file():
            assert f.relative_to(REPO).as_posix() in rep
    assert {"src/gpulab/limits.yaml", "scripts/report.py",
            "src/gpulab/p2pBandwidthLatencyTest_a5000.txt"} <= rep
    one = {Path(p).relative_to(REPO).as_posix() for p in workflow.report_code(REPO, ["probe"])}
    assert "src/gpulab/probe/section.py" in one and "src/gpulab/gemm/section.py" not in one


def test_findings_rules_are_report_code_not_stage_code():
    # issue 27: a stage's findings rules are read by the report only; editing one must re-render the
    # report, not rerun the benchmark (before, every .py of a stage's package was its job's code).
    found = [s for s in stages.STAGES if (REPO / "src/gpulab" / s / "findings.py").is_file()]
    assert found
    for s in found:
        rule = f"src/gpulab/{s}/findings.py"
        assert rule not in {Path(p).as_posix() for p in workflow.stage_code(s, Path("."))}
        assert rule in {Path(p).relative_to(REPO).as_posix() for p in workflow.report_code(REPO, [s])}


def test_code_inputs_have_no_leading_dot_slash():
    # Snakemake warns on every rule whose inputs start with "./" (the workflow's base is ".").
    paths = workflow.stage_code("transfer", Path(".")) + workflow.report_code(Path("."))
    assert paths and not [p for p in paths if p.startswith("./")]


def test_closure_sees_an_edit(tmp_path):
    root = _tree(tmp_path, {"src/gpulab/__init__.py": "", "src/gpulab/a.py": "",
                            "src/gpulab/b.py": ""})
    first = _names(code_inputs.code_closure([root / "src/gpulab/a.py"], root / "src"), root)
    a = root / "src/gpulab/a.py"
    a.write_text("import gpulab.b\n")
    os.utime(a, ns=(a.stat().st_mtime_ns + 10**9,) * 2)
    second = _names(code_inputs.code_closure([a], root / "src"), root)
    assert "src/gpulab/b.py" not in first and "src/gpulab/b.py" in second


def _all_code(monkeypatch, cache: str) -> dict:
    monkeypatch.setenv("GPULAB_CACHE_DIR", cache)
    code_inputs._facts.cache_clear()  # this process's memory of parsed files: read the disk cache
    out = {s: workflow.stage_code(s, REPO) for s in stages.STAGES}
    out["report"] = workflow.report_code(REPO)
    return out


def test_the_syntax_cache_gives_the_closures_a_parse_gives_and_survives_damage(tmp_path, monkeypatch):
    parsed = _all_code(monkeypatch, "off")
    cache = tmp_path / "cache"
    assert _all_code(monkeypatch, str(cache)) == parsed  # cold: parses, then keeps
    entries = sorted((cache / "code-facts").rglob("*.json"))
    assert len(entries) >= len(list((REPO / "src/gpulab").rglob("*.py"))) // 2
    assert _all_code(monkeypatch, str(cache)) == parsed  # warm: read back
    # A damaged entry (a full disk, a crash mid-write elsewhere) is parsed again, never trusted:
    # emptied, every import of every module would be lost and the closures would shrink.
    for e in entries:
        e.write_text("{not json")
    entries[0].write_text('{"imports": 7}')
    assert _all_code(monkeypatch, str(cache)) == parsed
    # A cache folder that cannot be made (here a file stands in its way; read-only homes alike)
    # costs a parse, never the run, and leaves no half-written entry behind.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    assert _all_code(monkeypatch, str(blocked)) == parsed
    assert blocked.read_text() == "a file, not a folder"
    # (An entry that is valid but wrong cannot be reached: its key is the file's own bytes.)
    code_inputs._facts.cache_clear()  # later tests parse afresh, not with this test's memory


def test_one_files_bytes_in_two_packages_resolve_their_own_relative_imports(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_CACHE_DIR", str(tmp_path / "cache"))
    body = "from . import x\n"
    root = _tree(tmp_path / "t", {"src/gpulab/__init__.py": "", "src/gpulab/p/__init__.py": "",
                                  "src/gpulab/p/a.py": body, "src/gpulab/p/x.py": "",
                                  "src/gpulab/q/__init__.py": "", "src/gpulab/q/a.py": body,
                                  "src/gpulab/q/x.py": ""})
    p = _names(code_inputs.code_closure([root / "src/gpulab/p/a.py"], root / "src"), root)
    q = _names(code_inputs.code_closure([root / "src/gpulab/q/a.py"], root / "src"), root)
    assert "src/gpulab/p/x.py" in p and "src/gpulab/q/x.py" not in p
    assert "src/gpulab/q/x.py" in q and "src/gpulab/p/x.py" not in q


# --- host sharing --------------------------------------------------------------------------------

def test_no_two_timing_or_cpu_heavy_jobs_fit_on_one_host_together():
    quiet = {s.name: workflow.host_quiet(s, True) for s in stages.STAGES.values()}
    busy = [n for n, s in stages.STAGES.items() if s.timing_sensitive or s.cpu_heavy]
    assert busy
    for a in busy:
        for b in busy:  # any two of them (the same rule twice too) exceed the host
            assert quiet[a] + quiet[b] > workflow.HOST_QUIET_UNITS, (a, b, quiet)
    assert all(quiet[n] == 0 for n in stages.STAGES if n not in busy)
    # CPU-heavy work of no stage (report figures) takes the whole host too
    assert workflow.host_quiet_cpu_heavy(True) + min(quiet[b] for b in busy) > workflow.HOST_QUIET_UNITS
    assert workflow.host_quiet_cpu_heavy(False) == 0
    assert set(workflow.host_quiet(s, False) for s in stages.STAGES.values()) == {0}


@pytest.mark.parametrize("k", [1, 2, 3, 8, 7, 1000, 1001])
def test_jobs_meant_to_overlap_fit_together_and_nothing_else_beside_them(k):
    spec = next(s for s in stages.STAGES.values() if s.timing_sensitive)
    share = workflow.host_quiet(spec, True, share=k)
    if k <= workflow.HOST_QUIET_UNITS:
        assert k * share <= workflow.HOST_QUIET_UNITS
    assert share + workflow.host_quiet(spec, True) > workflow.HOST_QUIET_UNITS
    with pytest.raises(ValueError):
        workflow.host_quiet(spec, True, share=0)


# --- GPU counts ----------------------------------------------------------------------------------

def _cfg(**stage_gpus):
    cfg = {"devices": {"backend": "auto", "cpu_devices": 2, "gpus": None}}
    for name in stages.STAGES:
        cfg[name] = {"gpus": stage_gpus.get(name, "all")}
    return cfg


def test_gpus_for_checks_the_host_and_the_cap():
    spec = stages.get("transfer")
    assert workflow.gpus_for(spec, _cfg(), 4) == 4
    assert workflow.gpus_for(spec, _cfg(transfer=2), 4, cap=SimpleNamespace(value=2)) == 2
    assert workflow.gpus_for(spec, _cfg(), 0) == 0
    with pytest.raises(workflow.WorkflowConfigError, match="transfer.gpus asks for 5 GPU.s. but "
                                                           "this host has 4"):
        workflow.gpus_for(spec, _cfg(transfer=5), 4)
    with pytest.raises(workflow.WorkflowConfigError, match="--resources gpu=1"):
        workflow.gpus_for(spec, _cfg(), 2, cap=1)
    cpu_only = next(s for s in stages.STAGES.values() if s.gpus == "none")
    assert workflow.gpus_for(cpu_only, _cfg(), 8) == 0


def test_host_gpus():
    cfg = _cfg()
    assert workflow.host_gpus(cfg, ["0", "1"]) == 2
    cfg["devices"]["gpus"] = 8
    assert workflow.host_gpus(cfg, []) == 8
    cfg["devices"]["backend"] = "cpu"
    assert workflow.host_gpus(cfg, ["0"]) == 0
    cfg["devices"].update(backend="cuda", gpus=None)
    with pytest.raises(workflow.WorkflowConfigError, match="backend is 'cuda'"):
        workflow.host_gpus(cfg, [])


def test_slurm_resources_and_threads():
    assert workflow.slurm_resources(4, 1) == {"gpu": 4}
    assert workflow.slurm_resources(4, 2) == {"gpu": 0, "nodes": 2, "tasks": 2, "mpi": "srun",
                                              "tasks_per_gpu": 0, "gres": "gpu:4"}
    multi = next(s for s in stages.STAGES.values() if s.multiprocess)
    single = next(s for s in stages.STAGES.values() if not s.multiprocess)
    assert workflow.stage_threads(multi, 0, 3) == 3 and workflow.stage_threads(multi, 4, 3) == 4
    assert workflow.stage_threads(single, 4, 3) == 1


# --- parse-time side effects ---------------------------------------------------------------------

class FakeWorkflow:
    def __init__(self, basedir, resources=None, main=True):
        self.basedir = str(basedir)
        self.is_main_process = main
        self.global_resources = dict(resources or {})

    def register_resource(self, name, value):
        self.global_resources[name] = value


@pytest.fixture
def no_lock_clearing(monkeypatch):
    """In this process a real clearing would hold its run lock until pytest ends (see the test of
    the clearing itself, in a fresh interpreter)."""
    from gpulab import lifetime

    monkeypatch.setattr(lifetime, "clear_stale_snakemake_locks", lambda: [])


def test_parse_time_setup_sets_the_job_environment_and_registers_resources(
        tmp_path, monkeypatch, no_lock_clearing):
    monkeypatch.chdir(tmp_path)
    env = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "PYTHONPATH": "/elsewhere", "NCCL_NVLS_ENABLE": "1"}
    monkeypatch.setenv("GPULAB_GPU_POOL", "0,1,2")
    said = []
    wf = FakeWorkflow(tmp_path / "repo")
    facts = workflow.parse_time_setup(wf, _cfg(), environ=env, say=said.append)
    assert facts == {"pool": ["0", "1", "2"], "host_gpus": 3}
    assert wf.global_resources == {"gpu": 3, "host_quiet": workflow.HOST_QUIET_UNITS}
    # forced, not defaulted: a user's FASTEST_FIRST would renumber the GPUs the slots hand out
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "repo" / "src"), "/elsewhere"])
    assert env["NCCL_NVLS_ENABLE"] == "1"  # a default the user may override
    assert env["GPULAB_OWNER_PID"]
    assert set(workflow.JOB_ENV_DECLARED) <= set(env)


def test_parse_time_setup_keeps_a_given_cap_and_says_when_it_is_moot(tmp_path, monkeypatch,
                                                                     no_lock_clearing):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPULAB_GPU_POOL", "")
    said = []
    wf = FakeWorkflow(tmp_path, {"gpu": 2, "host_quiet": 5})
    workflow.parse_time_setup(wf, _cfg(), environ={}, say=said.append)
    assert wf.global_resources == {"gpu": 2, "host_quiet": 5}
    assert len(said) == 1 and "--resources gpu=2 but this host has no GPU" in said[0]


def test_parse_time_setup_removes_a_killed_runs_locks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPULAB_GPU_POOL", "")
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("")
    # a fresh interpreter: the kernel lock is held per process, once
    code = ("import sys; from gpulab import workflow; from tests.test_workflow_module import "
            "FakeWorkflow, _cfg; workflow.parse_time_setup(FakeWorkflow('.'), _cfg(), environ={}, "
            "say=print)")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])})
    assert p.returncode == 0, p.stderr
    assert "left by a killed run" in p.stdout and not (locks / "0.input.lock").exists()


def test_every_job_gets_pci_bus_order_whatever_it_inherits():
    from gpulab import slots

    assert slots.job_env(["1"], base={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})[
        "CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    p = subprocess.run([sys.executable, "-c", "import os, gpulab.devices; "
                        "print(os.environ['CUDA_DEVICE_ORDER'])"], capture_output=True, text=True,
                       env={**os.environ, "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
                            "PYTHONPATH": str(REPO / "src")})
    assert p.stdout.strip() == "PCI_BUS_ID", p.stderr


def test_workflow_module_names_no_stage():
    text = (REPO / "src/gpulab/workflow.py").read_text()
    for name in stages.STAGES:
        assert f'"{name}"' not in text and f"'{name}'" not in text, name


def test_the_report_assembly_reads_findings_rules_but_no_section():
    # The assembly only joins current fragments: a section edit re-renders that stage's fragment,
    # then the assembly (its fragment changed), never every chapter.
    asm = {Path(p).relative_to(REPO).as_posix() for p in workflow.report_code(REPO, assembly=True)}
    full = {Path(p).relative_to(REPO).as_posix() for p in workflow.report_code(REPO)}
    sections = {workflow.section_file(s, REPO).relative_to(REPO).as_posix()
                for s in stages.STAGES.values() if workflow.section_file(s, REPO).is_file()}
    assert sections and sections <= full and not sections & asm
    assert "src/gpulab/gemm/findings.py" in asm and "scripts/report.py" in asm
