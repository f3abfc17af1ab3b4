"""Multi-process launcher shared by the stages that need one process per device (torchrun).

The stage script (parent, holding its GPU slots) calls :func:`run_workers`, which starts
``torchrun`` on a worker module. The worker calls :func:`worker_main` with a function
``fn(ctx: WorkerContext, payload: dict) -> dict``; each rank's return value comes back to the parent
as a list ordered by rank. NCCL is used on GPUs, gloo on CPU virtual devices.

    # parent
    rows = launch.run_workers("gpulab.collectives.worker", payload, nproc=4)
    # worker module
    if __name__ == "__main__":
        launch.worker_main(my_fn)
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from gpulab import lifetime

log = logging.getLogger("gpulab.launch")

# Children inherit these; NVLink multicast (NVLS) stays off on shared hosts (see README).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class LaunchError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class NodeSpec:
    """Where this torchrun agent sits in a (possibly multi-node) job."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "NodeSpec":
        cfg = cfg or {}
        return cls(int(cfg.get("nnodes", 1)), int(cfg.get("node_rank", 0)),
                   str(cfg.get("master_addr", "127.0.0.1")), cfg.get("master_port"))


def torchrun_cmd(module: str, args: list[str], nproc: int, node: NodeSpec = NodeSpec()) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if node.nnodes == 1 and node.master_port is None:
        cmd += ["--standalone"]
    else:
        # Static rendezvous: ranks follow --node-rank (c10d rendezvous assigns them by arrival).
        cmd += [f"--nnodes={node.nnodes}", f"--node-rank={node.node_rank}",
                f"--master-addr={node.master_addr}", f"--master-port={node.master_port or 29500}"]
    return cmd + ["-m", module, *args]


def run_workers(module: str, payload: Mapping[str, Any], nproc: int, *, node: NodeSpec = NodeSpec(),
                env: Mapping[str, str] | None = None, timeout: float = 1800) -> list[dict]:
    """Run ``module`` on ``nproc`` ranks and return each local rank's result (rank order)."""
    if nproc < 1:
        raise LaunchError(f"nproc must be >= 1, got {nproc}")
    with tempfile.TemporaryDirectory(prefix="gpulab-launch-") as tmp:
        pfile = Path(tmp) / "payload.json"
        pfile.write_text(json.dumps(payload, default=str))
        cmd = torchrun_cmd(module, ["--payload", str(pfile), "--out-dir", tmp], nproc, node)
        child_env = {**os.environ, **SAFE_ENV, **(env or {})}
        child_env.setdefault("OMP_NUM_THREADS", "1")
        log.info("launch: %s", " ".join(cmd))
        p = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=lifetime.die_with_parent)
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except BaseException as exc:
            # SIGTERM lets the agent stop its workers (they sit in sessions of their own); the
            # default SIGKILL of subprocess.run would orphan them.
            with lifetime.sigint_ignored():
                lifetime.stop(p)
            if isinstance(exc, subprocess.TimeoutExpired):
                raise LaunchError(f"{module} on {nproc} rank(s) ran past {timeout:.0f} s") from None
            raise
        if p.returncode != 0:
            raise LaunchError(f"{module} failed on {nproc} rank(s) (exit {p.returncode}):\n"
                              f"{stdout[-3000:]}\n{stderr[-6000:]}")
        outs = sorted(Path(tmp).glob("rank*.json"), key=lambda f: int(f.stem[4:]))
        results = [json.loads(f.read_text()) for f in outs]
        if len(results) != nproc:
            raise LaunchError(f"{module}: expected {nproc} rank results, got {len(results)}")
        return results


@dataclass
class WorkerContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.device)


def init_distributed(backend: str = "auto") -> WorkerContext:
    """Join the process group torchrun set up; one device per local rank."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = backend in ("auto", "nccl") and torch.cuda.is_available()
    if backend == "nccl" and not use_cuda:
        raise LaunchError("backend nccl requested but no CUDA device is visible")
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise LaunchError(f"local rank {local_rank} has no GPU of its own "
                              f"({torch.cuda.device_count()} visible)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        be = "nccl"
    else:
        device, be = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        kwargs = {"device_id": device} if be == "nccl" else {}
        dist.init_process_group(be, **kwargs)
    return WorkerContext(dist.get_rank(), dist.get_world_size(), local_rank, be, device)


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        # A barrier first: a plain destroy sometimes aborts a rank at exit (3 of 32 runs, gloo).
        dist.barrier()
        dist.destroy_process_group()


def worker_main(fn: Callable[[WorkerContext, dict], dict], backend: str = "auto") -> None:
    import argparse

    ap = argparse.ArgumentParser(description="gpulab worker (started by torchrun)")
    ap.add_argument("--payload", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args()
    # The agent starts workers in sessions of their own; if it is killed, nothing else stops them.
    lifetime.die_with_parent(signal.SIGKILL)
    payload = json.loads(args.payload.read_text())
    ctx = init_distributed(payload.get("backend", backend))
    try:
        out = fn(ctx, payload)
    finally:
        shutdown()
    tmp = args.out_dir / f".rank{ctx.rank}.json.tmp"
    tmp.write_text(json.dumps(out, default=float))
    os.replace(tmp, args.out_dir / f"rank{ctx.rank}.json")
