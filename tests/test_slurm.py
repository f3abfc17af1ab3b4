"""A small part of the pipeline through a real single-node SLURM cluster (CI installs slurm-wlm)."""
import os
import shutil
import subprocess

import pytest
import yaml

from conftest import snakemake
from gpulab import results
from slurm.cluster import Cluster, available

pytestmark = [pytest.mark.e2e, pytest.mark.machine_wide("slurm")]  # /etc/slurm

if shutil.which("sbatch") is None and not os.path.exists("/usr/bin/sbatch"):
    pytest.skip(available() or "SLURM not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = available()
    if reason:
        pytest.skip(reason)
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    c.start()
    yield c
    c.stop()


def test_probe_runs_as_a_slurm_job_with_a_gpu_of_its_own(cluster, workflow_dir):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    (workflow_dir / "cluster.yaml").write_text(yaml.safe_dump({"devices": {"gpus": 1},
                                                                "probe": {"gpus": 1}}))
    p = snakemake(
        workflow_dir, "--profile", "workflow/profiles/slurm", "--configfile", "cluster.yaml",
        "--jobs", "2", "--slurm-status-command", "squeue", "--slurm-no-account",
        "--slurm-init-seconds-before-status-checks", "2", "--default-resources", "mem_mb=500",
        "runtime=10", "cpus_per_task=1", "--", "probe",
        env={**cluster.env, "GPULAB_HOST": "slurmnode"},
        timeout=600, check=False, fast_slurm_polls=True)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-6000:] + cluster.logs()
    assert "sbatch" in log or "Job" in log
    a = results.read_attrs(workflow_dir / "results" / "probe" / "slurmnode.h5")
    # SLURM granted --gpus=1 and set CUDA_VISIBLE_DEVICES; gpulab-slot handed out exactly that id.
    assert a["device_ids"] == "0", a["device_ids"]
    assert a["device_kind"] == "cpu"  # fake GPUs: the probe ran its CPU path
