import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, snakemake
from gpulab import slots


@pytest.fixture
def pool(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_GPU_POOL", "0,1")
    monkeypatch.setenv("GPULAB_SLOT_DIR", str(tmp_path / "locks"))
    return tmp_path


def test_claims_are_exclusive(pool):
    with slots.claim(1) as a, slots.claim(1) as b:
        assert a != b and set(a + b) == {"0", "1"}
        with pytest.raises(slots.SlotError, match="no 1 free GPU ids"):
            with slots.claim(1, timeout=0.3):
                pass
    with slots.claim(2) as both:
        assert both == ["0", "1"]


def test_asking_for_more_than_the_host_has_is_a_clear_error(pool):
    with pytest.raises(slots.SlotError, match="asks for 3 GPU.*has 2"):
        with slots.claim(3):
            pass
    p = subprocess.run([sys.executable, "-m", "gpulab.slots", "--gpus", "3", "--", "true"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "asks for 3 GPU(s) but the host has 2" in p.stderr


def test_command_sees_its_ids_and_exit_code_passes_through(pool):
    code = "import os,sys; print(os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(7)"
    p = subprocess.run([sys.executable, "-m", "gpulab.slots", "--gpus", "2", "--",
                        sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 7 and p.stdout.strip() == "0,1"


def test_gpu0_job_hides_all_gpus(pool):
    p = subprocess.run([sys.executable, "-m", "gpulab.slots", "--gpus", "0", "--", sys.executable,
                        "-c", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"],
                       capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "''"


def test_killed_holder_releases_its_ids(pool):
    holder = subprocess.Popen([sys.executable, "-m", "gpulab.slots", "--gpus", "2", "--",
                               sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:  # wait until it holds both ids
            try:
                with slots.claim(1, timeout=0):
                    pass
                time.sleep(0.1)
            except slots.SlotError:
                break
        else:
            pytest.fail("holder never took the ids")
        os.killpg(holder.pid, signal.SIGKILL)  # a crash: no cleanup code runs
        holder.wait()
        with slots.claim(2, timeout=5) as ids:
            assert ids == ["0", "1"]
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)


@pytest.mark.e2e
def test_snakemake_jobs_never_share_an_id(pool):
    wf = pool / "wf"
    shutil.copytree(FIXTURES / "slots", wf)
    snakemake(wf, "--cores", "4", "--resources", "gpu=2",
              env={"GPULAB_GPU_POOL": "0,1", "GPULAB_SLOT_DIR": str(pool / "locks")})
    jobs = [json.loads(p.read_text()) for p in sorted((wf / "out").glob("*.json"))]
    assert len(jobs) == 6
    assert all(j["ids"] in ("0", "1") and j["ids"] == j["recorded"] for j in jobs)
    for i, a in enumerate(jobs):  # the same id is never held by two jobs at once
        for b in jobs[i + 1:]:
            if a["ids"] == b["ids"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"]
    events = sorted([(j["start"], 1) for j in jobs] + [(j["end"], -1) for j in jobs])
    running = peak = 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    assert peak == 2  # the two ids were used concurrently, never more
    assert {j["ids"] for j in jobs} == {"0", "1"}


def test_pool_prefers_explicit_pool_then_scheduler_restriction(monkeypatch):
    monkeypatch.setenv("GPULAB_GPU_POOL", "4,5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert slots.pool_ids() == ["4", "5"]
    monkeypatch.delenv("GPULAB_GPU_POOL")
    assert slots.pool_ids() == ["2", "3"]  # e.g. SLURM gave this job GPUs 2 and 3
    monkeypatch.setenv("GPULAB_GPU_POOL", "")
    assert slots.pool_ids() == []  # an explicit empty pool means: no GPUs for jobs
