"""Shared fixtures: a private copy of the workflow to run Snakemake in, and helpers to run it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
WORKFLOW_PARTS = ["Snakefile", "config.yaml", "profiles", "workflow", "scripts", "src"]


def _ctrl_c_as_in_a_terminal() -> None:
    """A suite started in the background (`make test &`, some CI runners) inherits SIGINT ignored,
    and every process a test starts would too: Ctrl-C tests would then time a process that ignores
    Ctrl-C (torchrun's 30 s grace) instead of a terminal's foreground job. Handlers reset to the
    default at exec; an ignored signal stays ignored, so the suite undoes it once, here."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    """Every Snakemake start imports the SLURM executor plugin, which asks ``scontrol show config``
    for the cluster's MinJobAge. On a machine with the SLURM client but no running controller (CI
    after apt-get install slurm-wlm) that question waits 9-10 s for a timeout, at every start. Tests
    that are not about SLURM get an ``scontrol`` that says "no controller" at once; the SLURM tests
    set SLURM_CONF for their own cluster, and then the real scontrol answers."""
    _ctrl_c_as_in_a_terminal()
    real = shutil.which("scontrol")
    if real is None:
        return
    shim = Path(tempfile.mkdtemp(prefix="gpulab-test-bin-"))
    (shim / "scontrol").write_text(
        "#!/bin/sh\n"
        '[ -z "$SLURM_CONF" ] && [ "$1" = show ] && [ "$2" = config ] && exit 1\n'
        f'exec {real} "$@"\n')
    (shim / "scontrol").chmod(0o755)
    os.environ["PATH"] = f"{shim}{os.pathsep}{os.environ.get('PATH', '')}"
    config._gpulab_shim = shim


def pytest_unconfigure(config):
    shim = getattr(config, "_gpulab_shim", None)
    if shim is not None:
        shutil.rmtree(shim, ignore_errors=True)


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / part)
    return dest


def copy_run(src: Path, dest: Path) -> Path:
    """A finished run's tree (workflow, results and Snakemake's records, file times kept) copied for
    a test that changes it: seconds, where running the pipeline again costs minutes."""
    shutil.copytree(src, dest, symlinks=True)
    return dest


# The host label and GPU pool of the CPU runs the tests share (no GPU ids handed out).
CPU_ENV = {"GPULAB_HOST": "testhost", "GPULAB_GPU_POOL": ""}


@pytest.fixture(scope="session")
def probe_report_run(tmp_path_factory) -> Path:
    """The probe and the report (config report.stages: [probe]), with another host's probe result
    copied into results/ as a user would, run once per session for every test that needs a finished
    small run. Read-only: a test that changes the tree works on copy_run(probe_report_run, ...)."""
    from gpulab import probe, results

    wf = copy_workflow(tmp_path_factory.mktemp("probe-report") / "wf")
    cfg_path = wf / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg.setdefault("report", {})["stages"] = ["probe"]
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPULAB_HOST", "otherhost")
        results.write(probe.build_result("probe", "main", {"gpus": "all"}, probe.collect()),
                      wf / "results" / "probe" / "otherhost.h5")
    snakemake(wf, "--cores", "2", env=CPU_ENV)
    return wf


@pytest.fixture
def workflow_dir(tmp_path) -> Path:
    """A private copy of the workflow (so tests never touch the checkout's results/)."""
    return copy_workflow(tmp_path / "wf")


def snakemake(cwd: Path, *args: str, env: dict | None = None, timeout: float = 900,
              check: bool = True) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    e.setdefault("GPULAB_SLOT_DIR", str(cwd / ".slots"))
    cmd = [sys.executable, "-m", "snakemake", *args]
    p = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
    return p


def planned_rules(cwd: Path, *args: str, env: dict | None = None) -> dict[str, int]:
    """Rules (with job counts) a dry run would execute."""
    p = snakemake(cwd, "--cores", "2", "--dry-run", *args, env=env)
    return job_counts(p.stdout + p.stderr)


def job_counts(out: str) -> dict[str, int]:
    """The job-count table of a Snakemake run's output."""
    counts: dict[str, int] = {}
    in_table = False
    for line in out.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            in_table = True
            continue
        if in_table:
            if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
                counts[parts[0]] = int(parts[1])
            elif parts and parts[0] == "total":
                break
    return counts


def marked_processes(mark: str):
    """Every live process started under a test's GPULAB_TEST_MARK (workers included: they inherit
    it), for the tests that check no process outlives its job."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("GPULAB_TEST_MARK") == mark \
                    and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def stage_settings(stage: str, **section):
    """A stage's typed view of a section given in part (the schema fills in the rest), as its job
    gets it."""
    from gpulab import config, stages

    return stages.get(stage).settings_class().from_section(config.validate_section(stage, section))


def stage_context(stage: str, variant: str, section: dict, devices: dict, out, extra=None):
    """A StageContext as a job gets one: its section and devices validated, defaults filled in, and
    the stage's config check passed."""
    from gpulab.stage import StageContext, validate_payload

    payload = validate_payload(stage, {"stage": dict(section), "devices": dict(devices)})
    return StageContext(stage, variant, payload["stage"], payload["devices"], out, extra or {})
