"""SLURM-awareness of the launcher without a cluster: environment -> node, failures -> node names."""
import pytest

from gpulab import slurm, slurm_agent


def test_node_comes_from_slurm_environment(monkeypatch):
    monkeypatch.setattr(slurm, "hostnames", lambda nodelist: {"gn[0-1]": ["gn0", "gn1"]}[nodelist])
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "gn[0-1]",
           "SLURM_JOB_NODELIST": "ignored"}
    node = slurm_agent.node_from_env(29555, env)
    assert (node.nnodes, node.node_rank, node.master_addr, node.master_port) == (2, 1, "gn0", 29555)


def test_outside_a_step_the_error_says_which_variable_is_missing():
    with pytest.raises(RuntimeError, match="SLURM_NNODES"):
        slurm_agent.node_from_env(1, {})


def test_failure_summary_names_the_first_failed_node_not_the_ones_srun_stopped():
    out = "\n".join([
        f"{slurm.MARK} host=n1 node_rank=1 exit=1 t=100.250",
        f"{slurm.STOPPED} host=n0 signal=15",
        "srun: error: n1: task 1: Exited with exit code 1",
        "srun: error: n0: task 0: Exited with exit code 1",
        "srun: error: n2: task 2: Killed",
    ])
    hosts, text = slurm.failure_summary(out)
    assert hosts == ["n1"]
    assert text.startswith("first failure on node n1")


def test_failure_summary_orders_nodes_by_when_they_failed_and_uses_srun_for_silent_ones():
    out = "\n".join([
        f"{slurm.MARK} host=b node_rank=1 exit=1 t=200.5",
        f"{slurm.MARK} host=a node_rank=0 exit=1 t=200.1",
        "srun: error: c: task 2: Exited with exit code 127",
    ])
    hosts, text = slurm.failure_summary(out)
    assert hosts == ["a", "b", "c"]
    assert "node c: Exited with exit code 127" in text
