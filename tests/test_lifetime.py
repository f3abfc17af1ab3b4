"""Every process a job starts ends with the job, whatever ends it (gpulab.lifetime)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import FIXTURES, REPO, kill_marked, marked_processes




def _gone_within(mark: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = marked_processes(mark)
        if not left:
            return []
        time.sleep(0.2)
    left = [" ".join(p.info["cmdline"])[:100] for p in marked_processes(mark)]
    kill_marked(mark)
    return left


def _until(cond, seconds: float = 120):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _env(mark: str, **extra) -> dict:
    src = str(REPO / "src")
    return {**os.environ, "GPULAB_TEST_MARK": mark, "GPULAB_GPU_POOL": "", **extra,
            "PYTHONPATH": os.pathsep.join([src, str(FIXTURES / "lifetime")])}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_stage_interrupted_during_a_launch_leaves_no_rank(tmp_path, how):
    """A rank that ignores Ctrl-C (blocked in a collective) still ends when its stage ends."""
    mark = uuid.uuid4().hex
    code = ("from gpulab import launch; launch.run_workers('stubborn_worker', "
            f"{{'ready': {str(tmp_path)!r}}}, nproc=2)")
    stage = subprocess.Popen([sys.executable, "-c", code], env=_env(mark), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _until(lambda: len(list(tmp_path.glob("rank*"))) == 2)
    if how == "SIGINT":  # Ctrl-C: the whole foreground group
        os.killpg(stage.pid, signal.SIGINT)
    else:
        stage.kill()
    stage.wait(timeout=60)
    assert _gone_within(mark, 20) == []


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_slot_holder_takes_its_command_with_it(tmp_path, how):
    mark = uuid.uuid4().hex
    slot = subprocess.Popen([sys.executable, "-m", "gpulab.slots", "--gpus", "0", "--", "sleep", "300"],
                            env=_env(mark, GPULAB_SLOT_DIR=str(tmp_path)))
    _until(lambda: any(p.info["name"] == "sleep" for p in marked_processes(mark)))
    slot.send_signal(getattr(signal, how))
    rc = slot.wait(timeout=30)
    assert _gone_within(mark, 10) == []
    if how == "SIGTERM":
        assert rc == 128 + signal.SIGTERM


def test_job_stops_when_its_snakemake_process_is_killed(tmp_path):
    """SIGKILL of Snakemake leaves its job shell running; the slot holder watches the owner."""
    mark = uuid.uuid4().hex
    # The trailing ':' keeps bash alive as the owner (no exec of the last command).
    owner = subprocess.Popen(
        ["bash", "-c", f"export GPULAB_OWNER_PID=$(hostname):$$; {sys.executable} -m gpulab.slots --gpus 0 "
                       "-- sleep 300; :"], env=_env(mark, GPULAB_SLOT_DIR=str(tmp_path)))
    _until(lambda: any(p.info["name"] == "sleep" for p in marked_processes(mark)))
    owner.kill()
    owner.wait()
    assert _gone_within(mark, 15) == []


@pytest.mark.slow
def test_isolated_phase_dies_with_its_stage():
    mark = uuid.uuid4().hex
    code = "import time; from gpulab.transfer.isolate import run_isolated; run_isolated(time.sleep, 300)"
    stage = subprocess.Popen([sys.executable, "-c", code], env=_env(mark))
    _until(lambda: len(marked_processes(mark)) >= 2)  # the stage and its spawned phase
    time.sleep(1)  # past the spawn's start-up, into fn
    stage.kill()
    stage.wait()
    assert _gone_within(mark, 10) == []


def test_stale_snakemake_locks_are_removed_only_when_no_run_is_alive(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("x")
    code = f"from gpulab import lifetime; print(len(lifetime.clear_stale_snakemake_locks({str(tmp_path)!r})))"
    run = lambda: subprocess.run([sys.executable, "-c", code], env=_env("x"), capture_output=True,
                                 text=True, check=True).stdout.strip()
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / ".snakemake" / "gpulab-run.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run() == "0" and (locks / "0.input.lock").exists()  # a live run's locks stay
    finally:
        holder.kill()
        holder.wait()
    assert run() == "1" and not (locks / "0.input.lock").exists()


@pytest.mark.slow
def test_sigterm_to_a_multi_process_stage_stops_its_ranks_and_leaves_no_file(tmp_path):
    """How Snakemake stops a job: SIGTERM to the stage process alone. The stage unwinds (the
    shared handler in gpulab.stage), stops the ranks it launched and exits 143 with no file."""
    import json

    import yaml

    cfg = yaml.safe_load((REPO / "config.yaml").read_text()).get("collectives", {})
    cfg.update({"ops": ["all_reduce"], "algorithms": ["ring"], "sizes_bytes": [1 << 20],
                "warmup": 0, "repeats": 500, "iters": 20})
    mark = uuid.uuid4().hex
    out = tmp_path / "res" / "default.h5"
    payload = json.dumps({"stage": cfg, "devices": {"backend": "cpu", "cpu_devices": 2}})
    stage = subprocess.Popen([sys.executable, str(REPO / "scripts" / "collectives.py"), "--config-json",
                              payload, "--variant", "default", "--out", str(out)], env=_env(mark),
                             stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"))
    try:
        # the torchrun agent and its two ranks all name the worker module
        _until(lambda: sum("gpulab.collectives.worker" in " ".join(p.info["cmdline"])
                           for p in marked_processes(mark)) >= 3)
        stage.send_signal(signal.SIGTERM)
        assert stage.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        stage.kill()
    assert _gone_within(mark, 20) == []
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    assert "stopped by SIGTERM" in (tmp_path / "stderr").read_text()


_DEFERRED = """
import os, signal, sys, time
from gpulab import lifetime

def body():
    with lifetime.sigterm_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # a library call that must not be stopped half-way
        print("block finished", flush=True)
    print("after the block", flush=True)
    return 0

sys.exit(lifetime.unwind_on_sigterm(body))
"""


def test_a_sigterm_inside_a_deferred_block_unwinds_when_the_block_ends():
    """pandas' parallel CSV reader stopped mid-call segfaulted (exit -11, temporaries left): inside
    ``sigterm_deferred`` the SIGTERM waits for the call, then unwinds the stage as usual (143)."""
    p = subprocess.run([sys.executable, "-c", _DEFERRED], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert p.returncode == 143, p.stderr[-2000:]
    assert p.stdout.splitlines() == ["block finished"], p.stdout
    # Without the block, the same SIGTERM stops the body at once: the block is what waits.
    undeferred = _DEFERRED.replace("with lifetime.sigterm_deferred():", "if True:")
    p = subprocess.run([sys.executable, "-c", undeferred], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert p.returncode == 143 and p.stdout == "", (p.stdout, p.stderr[-2000:])


def test_a_deferred_block_without_a_sigterm_leaves_the_handler_as_it_was():
    from gpulab import lifetime

    before = signal.getsignal(signal.SIGTERM)
    with lifetime.sigterm_deferred():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
