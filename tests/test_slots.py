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


# --- physical identity, lock folder hygiene (issue 29) ---

FAKE_NVML = FIXTURES / "fake_nvml"


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """NVML faked at the pynvml boundary, for this process and the jobs it starts."""
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("GPULAB_GPU_POOL", raising=False)
    monkeypatch.setenv("GPULAB_SLOT_DIR", str(tmp_path / "locks"))
    return tmp_path


def test_lock_names_come_from_the_gpu_uuid_not_the_visible_index(fake_nvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_UUIDS", "GPU-aaaa,GPU-bbbb,pci=00000000:19:00.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    shown = {s["id"]: s for s in slots.show()}
    assert shown["1"]["identity"] == "GPU-bbbb" and shown["1"]["lock"].endswith("gpu-GPU-bbbb.lock")
    assert shown["2"]["identity"] == "pci-00000000:19:00.0"  # no UUID: the PCI bus id
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7")
    assert [s["identity"] for s in slots.show()] == ["GPU-aaaa", "7"]  # 7: no GPU, no one to share
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    with slots.claim(2) as ids:
        assert ids == ["1", "2"]  # the job still gets the ids it can see
        assert sorted(p.name for p in (fake_nvml / "locks").iterdir()) == [
            "gpu-GPU-bbbb.lock", "gpu-pci-00000000:19:00.0.lock"]


def test_cpu_virtual_devices_keep_index_names(pool, monkeypatch):
    monkeypatch.setattr(slots, "_nvml_identities", lambda ids: None)  # no NVML, no nvidia-smi
    monkeypatch.setattr(slots, "_smi_identities", lambda ids: None)
    assert [s["lock"].rsplit("/", 1)[1] for s in slots.show()] == ["gpu-0.lock", "gpu-1.lock"]


def _start_job(env_extra, hold_s=2.0):
    env = {**os.environ, **env_extra}
    code = "import time,os; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep(%s)" % hold_s
    return subprocess.Popen([sys.executable, "-m", "gpulab.slots", "--gpus", "2", "--timeout", "0.5",
                             "--", sys.executable, "-c", code], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("a_env, b_env, share", [
    # SLURM with device cgroups: both jobs see 0,1, but on different physical GPUs.
    ({"CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVML_UUIDS": "GPU-a0,GPU-a1"},
     {"CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVML_UUIDS": "GPU-b0,GPU-b1"}, False),
    # Without cgroups: disjoint visible ids of one NVML view.
    ({"CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVML_UUIDS": "GPU-a0,GPU-a1,GPU-b0,GPU-b1"},
     {"CUDA_VISIBLE_DEVICES": "2,3", "FAKE_NVML_UUIDS": "GPU-a0,GPU-a1,GPU-b0,GPU-b1"}, False),
    # The same physical GPUs under different visible ids: they must wait for each other.
    ({"CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVML_UUIDS": "GPU-a0,GPU-a1"},
     {"CUDA_VISIBLE_DEVICES": "2,3", "FAKE_NVML_UUIDS": "GPU-x,GPU-y,GPU-a1,GPU-a0"}, True),
])
@pytest.mark.slow
def test_two_jobs_starting_at_once_wait_only_when_they_share_a_physical_gpu(
        fake_nvml, a_env, b_env, share):
    jobs = [_start_job(a_env), _start_job(b_env)]
    outs = [j.communicate(timeout=60) for j in jobs]
    codes = sorted(j.returncode for j in jobs)
    if share:  # one held both GPUs for 2 s; the other gave up after 0.5 s
        assert codes == [0, 2], outs
        assert any("no 2 free GPU ids" in err for _, err in outs)
    else:
        assert codes == [0, 0], outs


def test_lock_folder_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_SLOT_DIR", str(tmp_path / "new" / "locks"))
    d = slots.lock_dir()
    assert (d.stat().st_mode & 0o777) == 0o700


def test_lock_folder_of_another_owner_is_refused(pool, monkeypatch):
    (pool / "locks").mkdir(mode=0o700)
    monkeypatch.setattr(slots.os, "getuid", lambda: (pool / "locks").stat().st_uid + 1)
    with pytest.raises(slots.SlotError, match="belongs to uid .* not to you"):
        with slots.claim(1):
            pass


def test_group_or_world_writable_lock_folder_is_refused(pool):
    (pool / "locks").mkdir()
    os.chmod(pool / "locks", 0o777)
    with pytest.raises(slots.SlotError, match="writable by group or others"):
        with slots.claim(1):
            pass
    os.chmod(pool / "locks", 0o700)
    with slots.claim(1):
        pass


def test_lock_folder_that_is_a_symlink_is_refused(pool):
    (pool / "elsewhere").mkdir(mode=0o700)
    (pool / "locks").symlink_to(pool / "elsewhere")
    with pytest.raises(slots.SlotError, match="not a folder"):
        with slots.claim(1):
            pass


def test_planted_symlink_lock_file_is_never_followed(pool):
    d = pool / "locks"
    d.mkdir(mode=0o700)
    victim = pool / "victim.txt"
    victim.write_text("precious\n")
    (d / "gpu-0.lock").symlink_to(victim)
    with pytest.raises(slots.SlotError, match="is a symlink"):
        with slots.claim(2):
            pass
    assert victim.read_text() == "precious\n"  # not truncated, not locked
