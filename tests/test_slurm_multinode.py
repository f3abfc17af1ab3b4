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

from conftest import FASTPOLL, copy_workflow, stage_context
from gpulab import results
from slurm.cluster import TwoNodeCluster, namespaces_allowed

pytestmark = [pytest.mark.e2e, pytest.mark.machine_wide("slurm")]  # /etc/slurm

COLLECTIVES = {"variants": ["default"], "ops": ["all_reduce", "all_gather"], "algorithms": ["ring"],
               "sizes_bytes": [8, 4096], "warmup": 1, "repeats": 2, "iters": 1}
TRAIN = {"variants": ["ddp"], "models": ["mlp"], "mlp_hidden": [16], "warmup": 1, "repeats": 2,
         "curve_batch": 32, "curve_epochs": 1, "global_batches": [32], "per_device_batch": 8,
         "bucket_cap_mb": [25], "comm_hooks": ["none"], "lr_warmup_steps": 2,
         "equivalence_steps": 2, "device_counts": [4]}
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


def start_snakemake(cluster, wf: Path, config: dict, targets: list[str], env: dict | None = None,
                    timeout: int = 300) -> subprocess.Popen:
    """`snakemake --profile workflow/profiles/slurm <target>` on node 0 (the cluster's only
    network is inside the namespaces)."""
    (wf / "cluster.yaml").write_text(yaml.safe_dump(config))
    argv = ["timeout", str(timeout), sys.executable, str(FASTPOLL),
            "--profile", "workflow/profiles/slurm", "--configfile", "cluster.yaml", "--jobs", "2",
            "--slurm-status-command", "squeue", "--slurm-no-account",
            "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5",
            "--rerun-triggers", "mtime", "--default-resources", "mem_mb=500", "runtime=10",
            "cpus_per_task=1", "--", *targets]
    e = {**cluster.env, "GPULAB_HOST": HOST, "GPULAB_SLOT_DIR": str(wf / ".slots"),
         "GPULAB_JOIN_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(cluster.cmd(0, argv), cwd=wf, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def two_nodes(cluster, tmp_path_factory) -> Path:
    """The collectives and the DDP variant of the training stage, both set to two nodes, from ONE
    `snakemake --profile workflow/profiles/slurm` call (each job waits out the plugin's status
    polling, so one call costs half of two)."""
    from sklearn.datasets import load_digits

    from gpulab.data.api import write_training_set

    wf = copy_workflow(tmp_path_factory.mktemp("two") / "wf")
    d = load_digits()
    digits = wf / "results" / "data" / HOST / "train" / "digits.h5"
    digits.parent.mkdir(parents=True)
    write_training_set(digits, (d.images[:320] / 16.0).astype(np.float32)[:, None], d.target[:320])
    p = start_snakemake(cluster, wf, {"devices": TWO_NODES, "collectives": COLLECTIVES,
                                      "train": TRAIN}, ["collectives", f"results/train/{HOST}/ddp.h5"])
    out, _ = p.communicate(timeout=330)
    assert p.returncode == 0, out[-6000:] + "\n" + cluster.logs()
    return wf


def one_node(stage: str, variant: str, cfg: dict, out: Path, extra: dict | None = None) -> Path:
    """The same stage on one node with four ranks, run in this process (no SLURM)."""
    import importlib

    run = importlib.import_module(f"gpulab.{stage}").run
    ctx = stage_context(stage, variant, cfg, ONE_NODE, out, extra)
    return results.write(run(ctx), out)


def assert_placement(path: Path, cluster) -> None:
    a = results.read_attrs(path)
    assert a["hosts"] == cluster.hosts, a["hosts"]  # one file, both nodes' ranks
    placement = results.read_table(path, "placement").sort_values("rank")
    assert list(placement["rank"]) == [0, 1, 2, 3]
    assert list(placement["host"]) == [cluster.hosts[0]] * 2 + [cluster.hosts[1]] * 2
    assert list(placement["node_rank"]) == [0, 0, 1, 1]


def test_collectives_two_nodes_match_one_node(cluster, two_nodes, tmp_path):
    two = two_nodes / "results" / "collectives" / HOST / "default.h5"
    one = one_node("collectives", "default", COLLECTIVES, tmp_path / "one.h5")
    assert_placement(two, cluster)
    a2, a1 = results.read_attrs(two), results.read_attrs(one)
    assert a2["world_size"] == a1["world_size"] == 4
    assert a2["verdict"] == a1["verdict"] == "pass"
    checked = ["count", "world_size", "wrong"]
    for table, case in (("library", ["op", "mode", "bytes"]),
                        ("allreduce_algorithms", ["algorithm", "bytes"])):
        t2, t1 = (results.read_table(p, table)[case + checked].sort_values(case)
                  .reset_index(drop=True) for p in (two, one))
        assert len(t2) > 0 and (t2["wrong"] == 0).all()
        pd.testing.assert_frame_equal(t2, t1)
    # Only node 0 wrote, and only the one result file.
    assert sorted(p.name for p in two.parent.iterdir()) == ["default.h5"]


def test_ddp_two_nodes_match_one_node(cluster, two_nodes, tmp_path):
    two = two_nodes / "results" / "train" / HOST / "ddp.h5"
    digits = two_nodes / "results" / "data" / HOST / "train" / "digits.h5"
    one = one_node("train", "ddp", TRAIN, tmp_path / "one.h5", {"data": str(digits)})
    assert_placement(two, cluster)
    c2, c1 = (results.read_table(p, "checks").sort_values("check").reset_index(drop=True)
              for p in (two, one))
    assert list(c2["check"]) == list(c1["check"])
    assert list(c2["verdict"]) == list(c1["verdict"]) and (c2["verdict"] == "pass").all(), c2
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


def test_a_rank_killed_on_one_node_fails_the_job_naming_that_node(cluster, tmp_path):
    """The stage's command in a two-node batch job (what the rule runs, without Snakemake's
    status polling around it); rank 3, on node 1, is killed as soon as it exists."""
    import json

    tag, out = uuid.uuid4().hex, tmp_path / "collectives.h5"
    cfg = json.dumps({"stage": COLLECTIVES, "devices": TWO_NODES})
    script = Path(__file__).resolve().parents[1] / "scripts" / "collectives.py"
    job = (f"{sys.executable} {script} --config-json '{cfg}' --variant default --out {out}")
    argv = ["timeout", "200", "sbatch", "--wait", "--nodes=2", "--ntasks=2", "--cpus-per-task=1",
            "--mem=500", "-D", str(tmp_path), "-o", str(tmp_path / "job.log"), "--wrap", job]
    env = {**cluster.env, "GPULAB_TEST_TAG": tag, "GPULAB_JOIN_TIMEOUT_S": "60",
           "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    p = subprocess.Popen(cluster.cmd(0, argv), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        pid = None
        while pid is None and p.poll() is None and time.monotonic() - t0 < 150:
            pid = _find_rank(tag, 3)  # global rank 3: local rank 1 of node 1
            time.sleep(0.05)
        assert pid is not None, f"rank 3 never started: {p.communicate()[0]}"
        os.kill(pid, signal.SIGKILL)
        p.communicate(timeout=210)
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "job.log").read_text()
    assert p.returncode != 0, log[-4000:]
    assert time.monotonic() - t0 < 200  # bounded: kill-on-bad-exit, not gloo's 30-minute timeout
    # Node 0's agent was only stopped by srun after node 1 failed: it is not blamed.
    assert f"first failure on node {cluster.hosts[1]}:" in log, log[-4000:]
    assert f"then {cluster.hosts[0]}" not in log
    assert not out.exists()
