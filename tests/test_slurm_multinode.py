"""Multi-node stages through Snakemake's SLURM profile on a real two-node SLURM cluster: two slurmd
daemons, each in its own network + UTS namespace (tests/slurm/cluster.py), CPU ranks over gloo.

Two nodes x two ranks must give the same verified results as one node x four ranks, in ONE result
file listing both host names; a rank killed on one node must end the job with an error naming it.
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from gpulab import results
from gpulab.stage import StageContext
from slurm.cluster import TwoNodeCluster, namespaces_allowed

pytestmark = pytest.mark.e2e

COLLECTIVES = {"variants": ["default"], "ops": ["all_reduce", "all_gather"], "algorithms": ["ring"],
               "sizes_bytes": [8, 4096], "warmup": 1, "repeats": 2, "iters": 1}
TRAIN = {"variants": ["ddp"], "models": ["mlp"], "mlp_hidden": [16], "warmup": 1, "repeats": 2,
         "curve_batch": 32, "curve_epochs": 1, "global_batches": [32], "per_device_batch": 8,
         "bucket_cap_mb": [25], "comm_hooks": ["none"], "lr_warmup_steps": 2,
         "equivalence_steps": 2, "device_counts": [1, 2, 4]}
TWO_NODES = {"backend": "cpu", "cpu_devices": 2, "nodes": {"nnodes": 2}}
ONE_NODE = {"backend": "cpu", "cpu_devices": 4}
HOST = "cluster"  # the result path's host label, the same on the submit host and in the job


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    reason = namespaces_allowed()
    if reason:
        pytest.skip(f"two-node SLURM cluster not possible here: {reason}")
    with TwoNodeCluster(tmp_path_factory.mktemp("slurm2")) as c:
        yield c


def start_snakemake(cluster, wf: Path, config: dict, target: str, env: dict | None = None,
                    timeout: int = 240) -> subprocess.Popen:
    """`snakemake --profile workflow/profiles/slurm <target>` on node 0 (the cluster's only
    network is inside the namespaces)."""
    (wf / "cluster.yaml").write_text(yaml.safe_dump(config))
    argv = ["timeout", str(timeout), sys.executable, "-m", "snakemake",
            "--profile", "workflow/profiles/slurm", "--configfile", "cluster.yaml", "--jobs", "2",
            "--slurm-status-command", "squeue", "--slurm-no-account",
            "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5",
            "--rerun-triggers", "mtime", "--default-resources", "mem_mb=500", "runtime=10",
            "cpus_per_task=1", "--", target]
    e = {**cluster.env, "GPULAB_HOST": HOST, "GPULAB_SLOT_DIR": str(wf / ".slots"),
         "GPULAB_JOIN_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(cluster.cmd(0, argv), cwd=wf, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run_on_cluster(cluster, wf: Path, config: dict, target: str) -> str:
    p = start_snakemake(cluster, wf, config, target)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out[-6000:] + "\n" + cluster.logs()
    return out


def one_node(stage: str, variant: str, cfg: dict, out: Path, extra: dict | None = None) -> Path:
    """The same stage on one node with four ranks, run in this process (no SLURM)."""
    import importlib

    run = importlib.import_module(f"gpulab.{stage}").run
    ctx = StageContext(stage, variant, dict(cfg), dict(ONE_NODE), out, extra or {})
    return results.write(run(ctx), out)


def assert_placement(path: Path, cluster) -> None:
    a = results.read_attrs(path)
    assert a["hosts"] == cluster.hosts, a["hosts"]  # one file, both nodes' ranks
    placement = results.read_table(path, "placement").sort_values("rank")
    assert list(placement["rank"]) == [0, 1, 2, 3]
    assert list(placement["host"]) == [cluster.hosts[0]] * 2 + [cluster.hosts[1]] * 2
    assert list(placement["node_rank"]) == [0, 0, 1, 1]


def test_collectives_two_nodes_match_one_node(cluster, workflow_dir, tmp_path):
    run_on_cluster(cluster, workflow_dir, {"devices": TWO_NODES, "collectives": COLLECTIVES},
                   "collectives")
    two = workflow_dir / "results" / "collectives" / HOST / "default.h5"
    one = one_node("collectives", "default", COLLECTIVES, tmp_path / "one.h5")
    assert_placement(two, cluster)
    a2, a1 = results.read_attrs(two), results.read_attrs(one)
    assert a2["world_size"] == a1["world_size"] == 4
    assert a2["verified"] and a1["verified"] and a2["wrong_elements"] == a1["wrong_elements"] == 0
    checked = ["count", "world_size", "wrong", "verified"]
    for table, case in (("library", ["op", "mode", "bytes"]),
                        ("allreduce_algorithms", ["algorithm", "bytes"])):
        t2, t1 = (results.read_table(p, table)[case + checked].sort_values(case)
                  .reset_index(drop=True) for p in (two, one))
        assert len(t2) > 0 and t2["verified"].astype(bool).all()
        pd.testing.assert_frame_equal(t2, t1)
    # Only node 0 wrote, and only the one result file.
    assert sorted(p.name for p in two.parent.iterdir()) == ["default.h5"]


def test_ddp_two_nodes_match_one_node(cluster, workflow_dir, tmp_path):
    from sklearn.datasets import load_digits

    from gpulab.data.api import write_training_set

    d = load_digits()
    digits = workflow_dir / "results" / "data" / HOST / "train" / "digits.h5"
    digits.parent.mkdir(parents=True)
    write_training_set(digits, (d.images[:320] / 16.0).astype(np.float32)[:, None], d.target[:320])
    target = f"results/train/{HOST}/ddp.h5"
    run_on_cluster(cluster, workflow_dir, {"devices": TWO_NODES, "train": TRAIN}, target)
    two = workflow_dir / target
    one = one_node("train", "ddp", TRAIN, tmp_path / "one.h5", {"data": str(digits)})
    assert_placement(two, cluster)
    c2, c1 = (results.read_table(p, "checks").sort_values("check").reset_index(drop=True)
              for p in (two, one))
    assert list(c2["check"]) == list(c1["check"])
    assert list(c2["passed"]) == list(c1["passed"]) and c2["passed"].astype(bool).all(), c2
    # Same seeds, same world size: the DDP == single-device gaps agree, whatever the node layout.
    np.testing.assert_allclose(c2["value"].astype(float), c1["value"].astype(float),
                               rtol=1e-6, atol=1e-12)
    r2, r1 = (results.read_table(p, "ddp_ranks") for p in (two, one))
    assert sorted(set(r2["rank"])) == sorted(set(r1["rank"])) == [0, 1, 2, 3]


def _find_rank(tag: str, rank: int) -> int | None:
    """pid of torchrun's worker ``rank`` of the job started with GPULAB_TEST_TAG=tag."""
    want = {f"GPULAB_TEST_TAG={tag}".encode(), f"RANK={rank}".encode()}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = set((d / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env and any(v.startswith(b"TORCHELASTIC_RUN_ID=") for v in env):
            return int(d.name)
    return None


def test_a_rank_killed_on_one_node_fails_the_job_naming_that_node(cluster, workflow_dir):
    tag = uuid.uuid4().hex
    t0 = time.monotonic()
    p = start_snakemake(cluster, workflow_dir, {"devices": TWO_NODES, "collectives": COLLECTIVES},
                        "collectives", env={"GPULAB_TEST_TAG": tag})
    try:
        pid = None
        while pid is None and p.poll() is None and time.monotonic() - t0 < 120:
            pid = _find_rank(tag, 3)  # global rank 3: local rank 1 of node 1
            time.sleep(0.05)
        assert pid is not None, "rank 3 never started"
        os.kill(pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, out[-4000:]
    assert time.monotonic() - t0 < 200  # bounded: kill-on-bad-exit, not gloo's 30-minute timeout
    log = (workflow_dir / "results" / "logs" / "collectives" / HOST / "default.log").read_text()
    assert f"first failure on node {cluster.hosts[1]}" in log, log[-4000:]
    assert not (workflow_dir / "results" / "collectives" / HOST / "default.h5").exists()
