"""Device discovery: where no GPU driver node exists, a stage learns it has no GPU without importing
torch (its ranks import it; the stage process that launches them need not)."""
import subprocess
import sys

import pytest

from gpulab import devices


def _discover_in_a_fresh_process(nodes: list[str], backend: str = "auto") -> subprocess.CompletedProcess:
    code = (
        "import sys, json\n"
        "from gpulab import devices\n"
        f"devices.GPU_DEVICE_NODES = {tuple(nodes)!r}\n"
        f"found = devices.discover({backend!r}, cpu_count=3)\n"
        "print(json.dumps({'kinds': [d.kind for d in found], 'torch': 'torch' in sys.modules}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_without_a_gpu_device_node_discovery_never_imports_torch(tmp_path):
    import json

    p = _discover_in_a_fresh_process([str(tmp_path / "nvidiactl")])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"kinds": ["cpu"] * 3, "torch": False}


@pytest.mark.slow
def test_with_a_gpu_device_node_discovery_asks_torch(tmp_path):
    """The node is only a hint that a driver may be there: torch decides (no GPU on a CPU host)."""
    import json

    node = tmp_path / "nvidiactl"
    node.touch()
    p = _discover_in_a_fresh_process([str(node)])
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["torch"] is True
    import torch

    if not torch.cuda.is_available():
        assert got["kinds"] == ["cpu"] * 3


def test_cuda_requested_without_a_gpu_device_node_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "GPU_DEVICE_NODES", (str(tmp_path / "nvidiactl"),))
    with pytest.raises(RuntimeError, match="no CUDA GPU is visible"):
        devices.discover("cuda")
