"""Two torchrun agents as two "nodes" on loopback give the same result as one node."""
import threading
import time

import pytest

from gpulab import launch


def _run_nodes(nnodes: int, nproc: int, payload: dict, start: range | None = None):
    """Start node ranks ``start`` (default: all) of an ``nnodes``-node job; return each node's
    outcome: its results, or the exception it raised."""
    port = launch.free_port()
    outs: dict[int, object] = {}

    def agent(rank: int):
        try:
            node = launch.NodeSpec(nnodes, rank, "127.0.0.1", port)
            outs[rank] = launch.run_workers("gpulab.launch_check", payload, nproc, node=node, timeout=300)
        except BaseException as exc:  # surfaced by the caller
            outs[rank] = exc

    threads = [threading.Thread(target=agent, args=(r,)) for r in (start or range(nnodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(320)
    return outs


@pytest.mark.slow
def test_two_loopback_nodes_match_one_node_and_node_0_holds_every_rank():
    payload = {"numel": 2048}
    single = launch.run_workers("gpulab.launch_check", payload, nproc=4)
    outs = _run_nodes(2, 2, payload)
    # Node 1's ranks were gathered to global rank 0: node 1 holds nothing to write.
    assert isinstance(outs[1], launch.NotResultNode), outs[1]
    multi = outs[0]
    assert isinstance(multi, launch.RankResults), multi
    assert [r["rank"] for r in multi] == [0, 1, 2, 3]  # static rendezvous: ranks follow node rank
    assert all(r["world_size"] == 4 and r["ok"] for r in multi)
    assert [r["checksum"] for r in multi] == [r["checksum"] for r in single]
    assert [p["node_rank"] for p in multi.placement] == [0, 0, 1, 1]
    assert [p["local_rank"] for p in multi.placement] == [0, 1, 0, 1]


@pytest.mark.slow
def test_a_node_that_never_joins_fails_the_others_within_the_join_timeout(monkeypatch):
    monkeypatch.setenv("GPULAB_JOIN_TIMEOUT_S", "5")
    t0 = time.monotonic()
    outs = _run_nodes(2, 1, {"numel": 16}, start=range(1))  # node 1 never starts
    assert time.monotonic() - t0 < 60
    assert isinstance(outs[0], launch.MultiNodeFailure), outs[0]
    assert "1/2 clients joined" in str(outs[0])
    with pytest.raises(KeyError):
        outs[1]
