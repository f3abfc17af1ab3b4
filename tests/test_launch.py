import pytest

from conftest import fixtures_on_path
from gpulab import launch


@pytest.mark.slow
def test_two_gloo_ranks_all_reduce_exactly_and_say_where_they_ran():
    res = launch.run_workers("gpulab.launch_check", {"numel": 1000}, nproc=2)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["ok"] and r["backend"] == "gloo" and r["world_size"] == 2 for r in res)
    assert isinstance(res, launch.RankResults)
    assert [p["rank"] for p in res.placement] == [0, 1]
    assert [p["device_id"] for p in res.placement] == ["cpu:0", "cpu:1"]
    assert len({p["host"] for p in res.placement}) == 1


@pytest.mark.slow
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
    # One node inside an allocation stays a local launch, its ranks forked on this host.
    cmd = launch.launch_cmd("m", ["--x"], 2, launch.NodeSpec(), log_dir="/tmp/l")
    assert cmd[1:4] == ["-m", "gpulab.forkrun", "--nproc=2"] and cmd[-3:] == ["-m", "m", "--x"]


@pytest.mark.slow
def test_one_node_ranks_are_forked_from_one_process_that_imported_torch(tmp_path):
    """What the one-node launcher saves: no interpreter per rank. Every rank is a child of one
    launcher process and finds torch already imported when its module starts; each has its own
    environment (rank, log) and the rendezvous of a torchrun launch."""
    env = fixtures_on_path("launch")
    res = launch.run_workers("who_am_i", {}, nproc=3, env=env, timeout=120)
    assert [r["env_rank"] for r in res] == ["0", "1", "2"]
    assert len({r["ppid"] for r in res}) == 1 and len({r["pid"] for r in res}) == 3
    assert all(r["torch_before_main"] for r in res), res
    assert {r["world"] for r in res} == {"3"} and len({r["master_port"] for r in res}) == 1


@pytest.mark.slow
def test_sigterm_to_the_one_node_launcher_stops_ranks_that_ignore_ctrl_c(tmp_path):
    """The launcher is the agent the stage stops: SIGTERM ends it and every rank within the grace
    period (stubborn ranks ignore SIGINT), exit 143, nothing left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    payload = tmp_path / "payload.json"
    payload.write_text('{"ready": "%s"}' % tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "gpulab.forkrun", "--nproc=2",
                          f"--log-dir={tmp_path / 'logs'}", "-m", "stubborn_worker", "--payload",
                          str(payload), "--out-dir", str(tmp_path)],
                         env={**os.environ, **fixtures_on_path("lifetime")},
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*"))) < 2:
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read()
        time.sleep(0.1)
    ranks = psutil.Process(p.pid).children()
    assert len(ranks) == 2
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in p.stderr.read()
    assert not [r for r in ranks if r.is_running() and r.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_named_with_its_node_signal_and_own_log(tmp_path):
    """Issue 29: not "failed on 4 rank(s) (exit 1)" but which rank, where, how, and its last words,
    in the first line of the error and so in the failed check's (500-character) note."""
    import socket

    from gpulab.outcomes import Check

    env = fixtures_on_path("launch")
    with pytest.raises(launch.LaunchError) as err:
        launch.run_workers("kill_rank", {"kill_rank": 3, "marker": "marker-7f3a"}, nproc=4, env=env,
                           timeout=120)
    first = str(err.value).splitlines()[0]
    assert "rank 3 (local rank 3)" in first and "killed by SIGKILL" in first, first
    assert socket.gethostname().split(".")[0] in first  # its node
    assert "marker-7f3a" in first  # the tail of rank 3's own log
    f = err.value.failure
    assert (f.rank, f.exitcode) == (3, -9) and "marker-7f3a" in f.log_tail
    note = Check.crashed("gloo launch", err.value).note
    assert "rank 3" in note and "SIGKILL" in note and "marker-7f3a" in note, note


def test_first_failure_is_the_earliest_root_cause_over_nodes():
    out = "\n".join(
        f"Root Cause (first observed failure):\n[0]:\n  time      : {t}\n  host      : {h}\n"
        f"  rank      : {r} (local_rank: {lr})\n  exitcode  : {c} (pid: 1)\n" for t, h, r, lr, c in
        [("2026-12-03_10:00:05", "node-b", 5, 1, 1), ("2026-12-03_10:00:02", "node-a", 2, 2, -6)])
    f = launch.first_failure(out)
    assert (f.node, f.rank, f.local_rank) == ("node-a", 2, 2) and "SIGABRT" in f.describe()
    assert launch.first_failure("rendezvous timed out") is None


def test_the_report_names_the_rank_that_killed_a_launch(tmp_path):
    """The crashed check's note reaches the report's verification line of the stage."""
    import pandas as pd

    from gpulab import outcomes, results
    from gpulab.outcomes import Check
    from gpulab.kit.frames import checks_summary

    failure = launch.RankFailure(3, 3, "node-x", -9, "rank 3: last words")
    exc = launch.RankFailed(launch.failure_message("m", 4, launch.NodeSpec(), 1, "", "", failure),
                            failure)
    r = results.Result("collectives", "main", {}, "cpu")
    r.add_table("checks", outcomes.checks_frame([Check.crashed("gloo launch", exc),
                                                 Check("exact", "sum", "pass")]))
    text = checks_summary([results.write(r, tmp_path / "collectives/h/main.h5")])
    assert "1 failed" in text and "rank 3" in text and "node-x" in text and "SIGKILL" in text, text


@pytest.mark.parametrize("initialises_cuda", [False, True])
def test_a_preload_hook_runs_with_the_ranks_arguments_and_one_that_initialised_cuda_stops_the_launch(
        tmp_path, monkeypatch, initialises_cuda):
    """The guard behind forkrun's preload: ranks forked after CUDA was initialised could not use it,
    so a hook that initialised it stops the launch, naming the module. No CPU host can initialise
    CUDA, so the hook here flips what torch.cuda.is_initialized() answers; the check must come after
    the hook (a check before it would pass this degraded hook)."""
    import sys

    import torch

    from gpulab import forkrun

    (tmp_path / "hooked_worker.py").write_text(
        "CALLS = []\nCUDA_INITIALISED = False\n"
        "def preload(args):\n    global CUDA_INITIALISED\n    CALLS.append(args)\n"
        f"    CUDA_INITIALISED = {initialises_cuda}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # restored after; _preload sets it
    monkeypatch.delitem(sys.modules, "hooked_worker", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized",
                        lambda: getattr(sys.modules.get("hooked_worker"), "CUDA_INITIALISED", False))
    if initialises_cuda:
        with pytest.raises(SystemExit, match="importing hooked_worker initialised CUDA"):
            forkrun._preload("hooked_worker", ["--payload", "p.json"])
    else:
        forkrun._preload("hooked_worker", ["--payload", "p.json"])
    assert sys.modules["hooked_worker"].CALLS == [["--payload", "p.json"]]
