import pytest

from gpulab import launch


def test_two_gloo_ranks_all_reduce_exactly():
    res = launch.run_workers("gpulab.launch_check", {"numel": 1000}, nproc=2)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["ok"] and r["backend"] == "gloo" and r["world_size"] == 2 for r in res)


def test_failing_worker_raises_with_its_output():
    with pytest.raises(launch.LaunchError, match="failed on 2 rank"):
        launch.run_workers("gpulab.no_such_worker_module", {}, nproc=2, timeout=120)


def test_torchrun_cmd_static_rendezvous_for_multinode():
    cmd = launch.torchrun_cmd("m", ["--x"], 2, launch.NodeSpec(2, 1, "10.0.0.1", 29400))
    assert "--standalone" not in cmd
    assert "--node-rank=1" in cmd and "--master-addr=10.0.0.1" in cmd and cmd[-3:] == ["-m", "m", "--x"]
    assert "--standalone" in launch.torchrun_cmd("m", [], 2)
