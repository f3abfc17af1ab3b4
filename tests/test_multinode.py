"""Two torchrun agents as two "nodes" on loopback give the same result as one node."""
import threading

from gpulab import launch


def _run_nodes(nnodes: int, nproc: int, payload: dict) -> list[dict]:
    port = launch.free_port()
    outs: dict[int, list] = {}
    errors: list[BaseException] = []

    def agent(rank: int):
        try:
            node = launch.NodeSpec(nnodes, rank, "127.0.0.1", port)
            outs[rank] = launch.run_workers("gpulab.launch_check", payload, nproc, node=node, timeout=300)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(r,)) for r in range(nnodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(320)
    assert not errors, errors
    return [r for n in range(nnodes) for r in outs[n]]


def test_two_loopback_nodes_match_one_node():
    payload = {"numel": 2048}
    single = launch.run_workers("gpulab.launch_check", payload, nproc=4)
    multi = _run_nodes(2, 2, payload)
    assert [r["rank"] for r in multi] == [0, 1, 2, 3]  # static rendezvous: ranks follow node rank
    assert all(r["world_size"] == 4 and r["ok"] for r in multi)
    assert [r["checksum"] for r in multi] == [r["checksum"] for r in single]
