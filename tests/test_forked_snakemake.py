"""The suite's forked Snakemake (tests/forkedsnakemake.py) is `python -m snakemake`: the same jobs,
exit status, messages, working directory and environment, and a timeout that stops it."""
import os
import subprocess
import sys
import time

import pytest

import forkedsnakemake
from conftest import CPU_ENV, copy_workflow, job_counts

pytestmark = pytest.mark.slow


def _both(cwd, argv, env):
    fresh = subprocess.run([sys.executable, "-m", "snakemake", *argv], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=300)
    forked = forkedsnakemake.run(cwd, argv, env, timeout=300)
    return fresh, forked


def _env(**extra):
    return {**os.environ, **CPU_ENV, **extra}


def test_a_dry_run_of_the_workflow_plans_the_same_jobs_in_its_own_directory(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    env = _env(GPULAB_SLOT_DIR=str(wf / ".slots"), GPULAB_HOST="forkedhost")
    fresh, forked = _both(wf, ["--cores", "2", "--dry-run"], env)
    assert fresh.returncode == forked.returncode == 0, forked.stderr[-3000:]
    counts = job_counts(forked.stdout + forked.stderr)
    assert counts and counts == job_counts(fresh.stdout + fresh.stderr)
    # the environment reached the parse: the host label names the planned outputs
    assert "results/probe/forkedhost.h5" in forked.stdout + forked.stderr
    # Snakemake's run directory is the run's own, not the forkserver's
    assert f"Run directory: {wf}" in forked.stdout + forked.stderr


def test_a_bad_config_fails_with_the_same_status_and_message(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    env = _env(GPULAB_SLOT_DIR=str(wf / ".slots"))
    argv = ["--cores", "2", "--dry-run", "--config", "devices={cpu_devices: -3}"]
    fresh, forked = _both(wf, argv, env)
    assert fresh.returncode == forked.returncode != 0
    error = [line for line in (fresh.stdout + fresh.stderr).splitlines() if "cpu_devices" in line]
    assert error and all(line in forked.stdout + forked.stderr for line in error), forked.stdout[-3000:]


def test_a_run_past_its_timeout_is_stopped(tmp_path):
    (tmp_path / "Snakefile").write_text('rule all:\n    shell: "sleep 20"\n')
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forkedsnakemake.run(tmp_path, ["--cores", "1"], _env(), timeout=3)
    assert time.monotonic() - t0 < 30


def test_a_run_interrupted_in_the_test_is_stopped(tmp_path):
    """pytest-timeout or Ctrl-C raise inside the wait: the run must not outlive the test."""
    import signal

    import psutil

    def interrupt(signum, frame):
        raise RuntimeError("interrupted")

    (tmp_path / "Snakefile").write_text('rule all:\n    shell: "sleep 20"\n')
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 3)
    try:
        with pytest.raises(RuntimeError, match="interrupted"):
            forkedsnakemake.run(tmp_path, ["--cores", "1"], _env(), timeout=120)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)

    left = [p for p in psutil.process_iter(["cwd", "name"])
            if p.info["cwd"] == str(tmp_path) and "python" in (p.info["name"] or "")]
    assert not left


def test_slurm_runs_are_not_forked():
    assert forkedsnakemake.usable(_env())
    assert not forkedsnakemake.usable(_env(SLURM_CONF="/etc/slurm/slurm.conf"))
