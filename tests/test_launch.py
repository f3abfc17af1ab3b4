import pytest

from gpulab import launch


def test_two_gloo_ranks_all_reduce_exactly_and_say_where_they_ran():
    res = launch.run_workers("gpulab.launch_check", {"numel": 1000}, nproc=2)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["ok"] and r["backend"] == "gloo" and r["world_size"] == 2 for r in res)
    assert isinstance(res, launch.RankResults)
    assert [p["rank"] for p in res.placement] == [0, 1]
    assert [p["device_id"] for p in res.placement] == ["cpu:0", "cpu:1"]
    assert len({p["host"] for p in res.placement}) == 1


def test_failing_worker_raises_with_its_output():
    with pytest.raises(launch.LaunchError, match="failed on 2 rank"):
        launch.run_workers("gpulab.no_such_worker_module", {}, nproc=2, timeout=120)


def test_torchrun_cmd_static_rendezvous_for_multinode():
    cmd = launch.torchrun_cmd("m", ["--x"], 2, launch.NodeSpec(2, 1, "10.0.0.1", 29400))
    assert "--standalone" not in cmd
    assert "--node-rank=1" in cmd and "--master-addr=10.0.0.1" in cmd and cmd[-3:] == ["-m", "m", "--x"]
    assert "--standalone" in launch.torchrun_cmd("m", [], 2)


def test_multinode_rendezvous_has_a_join_timeout(monkeypatch):
    monkeypatch.setenv("GPULAB_JOIN_TIMEOUT_S", "42")
    cmd = launch.launch_cmd("m", [], 2, launch.NodeSpec(2, 0, "127.0.0.1", 29400))
    assert "--rdzv-conf=timeout=42" in cmd


def test_multinode_inside_slurm_allocation_starts_one_agent_per_node(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    cmd = launch.launch_cmd("m", ["--x"], 2, launch.NodeSpec(nnodes=3))
    assert cmd[0] == "srun" and "--nodes=3" in cmd and "--ntasks-per-node=1" in cmd
    assert "--kill-on-bad-exit=1" in cmd
    assert cmd[cmd.index("--nproc") + 1] == "2" and cmd[-3:] == ["--", "m", "--x"]
    # One node inside an allocation stays a plain local torchrun.
    assert "--standalone" in launch.launch_cmd("m", [], 2, launch.NodeSpec())
