"""Kernels stage through Snakemake: K independent gpu=1 jobs spread over a (fake) pool of 2 GPU ids.

The host has no GPU, so the jobs run the CPU kernel, but Snakemake and gpulab-slot hand out the ids
exactly as on a GPU host; the aggregation must show both ids used and two jobs running at once.
"""
import pytest
import yaml

from conftest import copy_workflow, snakemake
from gpulab import results

pytestmark = pytest.mark.e2e

ENV = {"GPULAB_HOST": "khost", "GPULAB_GPU_POOL": "0,1"}


@pytest.fixture(scope="module")
def jobs_run(tmp_path_factory):
    wf = copy_workflow(tmp_path_factory.mktemp("kernels") / "wf")
    cfg_path = wf / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["kernels"]["jobs"] = {"count": 2, "bytes": 65536, "seconds": 2.0}
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    snakemake(wf, "--cores", "2", "results/kernels/khost/jobs.h5", env=ENV)
    return wf


def test_independent_jobs_spread_over_the_pool_and_overlap(jobs_run):
    d = jobs_run / "results" / "kernels" / "khost"
    ids = sorted(results.read_attrs(d / f"job{i}.h5")["device_ids"] for i in range(2))
    assert ids == ["0", "1"]
    jobs = results.read_table(d / "jobs.h5", "jobs")
    assert sorted(jobs["cuda_visible_devices"]) == ["0", "1"] and jobs["verified"].all()
    s = results.read_table(d / "jobs.h5", "summary").iloc[0]
    # Both processes held their GPU at once (Snakemake started them together: 2 ids, 2 cores).
    assert s["devices_used"] == 2 and s["host_gpus"] == 2 and s["max_concurrency"] == 2
    checks = results.read_table(d / "jobs.h5", "checks")
    assert set(checks["check"]) == {"jobs spread over GPUs", "jobs ran concurrently", "output exact vs numpy"}
    assert (checks["verdict"] == "pass").all(), checks
    assert (jobs_run / "results/logs/kernels/khost/job0.log").exists()


def _host_quiet(wf, *args):
    import re

    from conftest import snakemake

    out = snakemake(wf, "--cores", "2", "--dry-run", "data", "transfer", "kernels", "kernels_jobs",
                    *args,
                    env={"GPULAB_HOST": "khost", "GPULAB_GPU_POOL": ""}).stdout
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"rule (\w+):.*?resources: [^\n]*host_quiet=(\d+)", out, re.S)}


def test_cpu_heavy_jobs_take_the_whole_host_from_timing_jobs(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    got = _host_quiet(wf)
    # data and every timing job hold every unit, so no two of them run together (issue 24: with
    # one unit each, transfer, sort, GEMM and kernels timed beside each other); the K independent
    # kernel jobs, one measurement meant to overlap (the test above), hold 1/K each
    k = yaml.safe_load((wf / "config.yaml").read_text())["kernels"]["jobs"]["count"]
    assert got["data"] == got["transfer"] == got["kernels"] == 1000, got
    assert got["kernels_job"] == 1000 // k and k * got["kernels_job"] <= 1000, got
    cfg = wf / "config.yaml"
    text = yaml.safe_load(cfg.read_text())
    assert text.get("quiet_host", True) is True  # the default (the schema's), not set off here
    cfg.write_text(yaml.safe_dump({**text, "quiet_host": False}, sort_keys=False))
    assert set(_host_quiet(wf).values()) == {0}
