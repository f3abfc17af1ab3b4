"""Multi-process launcher shared by the stages that need one process per device.

The stage script (parent, holding its GPU slots) calls :func:`run_workers`, which starts the
worker module's ranks: on one node by :mod:`gpulab.forkrun` (forked from one process that imported
torch once), on several nodes by ``torchrun`` (or srun inside a SLURM allocation). The worker
calls :func:`worker_main` with a function
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
import re
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from gpulab import forkrun, lifetime
from gpulab.forkrun import exit_description, free_port  # noqa: F401  (free_port: launch's API too)

log = logging.getLogger("gpulab.launch")

# Children inherit these; NVLink multicast (NVLS) stays off on shared hosts (see README): it can
# take a shared host's GPUs out of service. Only `devices.nvls: true` in the config lets it on.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def multicast_allowed(devices_config: Mapping[str, Any] | None) -> bool:
    """True only where the config opts in to NVLink multicast (``devices.nvls: true``). Fail-safe,
    not a second default: a `devices` slice without the key (a single-process stage's) never
    turns multicast on."""
    return bool((devices_config or {}).get("nvls"))


def safe_env(devices_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The environment a process that may use NCCL gets on top of its own (empty when opted in)."""
    return {} if multicast_allowed(devices_config) else dict(SAFE_ENV)


def apply_safe_env(devices_config: Mapping[str, Any] | None) -> dict[str, str]:
    """Force :data:`SAFE_ENV` into this process (a single-process multi-GPU stage); returns it.

    NCCL reads it when its first communicator is created, so call this before any CUDA collective.
    """
    env = safe_env(devices_config)
    os.environ.update(env)
    return env


class LaunchError(RuntimeError):
    pass




@dataclass(frozen=True)
class NodeSpec:
    """Where this torchrun agent sits in a (possibly multi-node) job."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "NodeSpec":
        """From the validated `devices.nodes` section (every key there, defaults filled in)."""
        return cls(cfg["nnodes"], cfg["node_rank"], cfg["master_addr"], cfg["master_port"])


def join_timeout() -> int:
    """Seconds a multi-node rendezvous waits for every node ($GPULAB_JOIN_TIMEOUT_S, default 300)."""
    return int(os.environ.get("GPULAB_JOIN_TIMEOUT_S", 300))


def torchrun_cmd(module: str, args: list[str], nproc: int, node: NodeSpec = NodeSpec(),
                 join_timeout: int | None = None, log_dir: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if log_dir is not None:
        # Each rank's own stdout/stderr also in <log_dir>/<run>/attempt_<n>/<local rank>/: a failed
        # launch quotes the log of the rank that failed first (see first_failure).
        cmd += [f"--log-dir={log_dir}", "--tee=3"]
    if node.nnodes == 1 and node.master_port is None:
        cmd += ["--standalone"]
    else:
        # Static rendezvous: ranks follow --node-rank (c10d rendezvous assigns them by arrival).
        cmd += [f"--nnodes={node.nnodes}", f"--node-rank={node.node_rank}",
                f"--master-addr={node.master_addr}", f"--master-port={node.master_port or 29500}"]
        if join_timeout is not None:
            # A node that never arrives fails the others' rendezvous after this, not torch's 600 s.
            cmd += [f"--rdzv-conf=timeout={int(join_timeout)}"]
    return cmd + ["-m", module, *args]


class EndsTheJob(Exception):
    """A launch outcome that ends the stage's job without a result of this node, so the stages'
    `except LaunchError` (a crash recorded as a failed check) never catches it."""


class MultiNodeFailure(EndsTheJob):
    """A launch over several nodes failed: the job ends with the node named and writes nothing
    (one node's partial view is not a result)."""


class NotResultNode(EndsTheJob):
    """This node took part in a multi-node run but does not hold the results: node 0 writes them."""


class RankResults(list):
    """Every rank's return value in global rank order, plus where each rank ran (``placement``)."""

    def __init__(self, outs: list[dict], placement: list[dict]):
        super().__init__(outs)
        self.placement = placement


def forkrun_cmd(module: str, args: list[str], nproc: int, log_dir: str) -> list[str]:
    """One node's ranks forked from one process that imported torch once (gpulab.forkrun)."""
    return [sys.executable, "-m", "gpulab.forkrun", f"--nproc={nproc}", f"--log-dir={log_dir}",
            "-m", module, *args]


def launch_cmd(module: str, args: list[str], nproc: int, node: NodeSpec,
               log_dir: str | None = None) -> list[str]:
    """One node: gpulab.forkrun (its ranks' logs and first failure in ``log_dir``). Several nodes:
    torchrun on this host, or, inside a SLURM allocation, srun starting one torchrun agent per node
    (node rank and rendezvous come from SLURM, not from ``node``)."""
    from gpulab import slurm

    if node.nnodes == 1 and node.master_port is None and log_dir is not None:
        return forkrun_cmd(module, args, nproc, log_dir)
    if node.nnodes > 1 and slurm.in_allocation():
        return slurm.srun_cmd(node.nnodes, nproc, node.master_port or free_port(), join_timeout(),
                              module, args)
    return torchrun_cmd(module, args, nproc, node, join_timeout=join_timeout(), log_dir=log_dir)


def launch_dir(node: NodeSpec) -> str | None:
    """Where the payload and results go: a node-local temp dir, except under srun, whose agents on
    the other nodes must read the payload (the working directory is shared in a SLURM job)."""
    from gpulab import slurm

    if node.nnodes > 1 and slurm.in_allocation():
        d = Path(os.environ.get("GPULAB_SHARED_TMP") or Path.cwd() / ".gpulab-launch")
        d.mkdir(parents=True, exist_ok=True)
        return str(d)
    return None


def this_node() -> str:
    """This host's short name, as a failure or a rank's placement names its node."""
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class RankFailure:
    """The rank that failed first in a launch, as its launcher (forkrun or torchrun) saw it."""

    rank: int
    local_rank: int
    node: str
    exitcode: int  # negative: killed by that signal
    log_tail: str = ""

    @property
    def how(self) -> str:
        return exit_description(self.exitcode)

    def describe(self) -> str:
        text = f"first failure: rank {self.rank} (local rank {self.local_rank}) on node " \
               f"{self.node}, {self.how}"
        if self.log_tail:
            text += f"; its log ends: {self.log_tail}"
        return text


# torchrun's agent ends a failed launch with a summary; its "Root Cause" entry is the first rank it
# saw fail (under srun every node's agent prints one: the earliest is the first failure).
_ROOT_CAUSE_RE = re.compile(
    r"Root Cause \(first observed failure\):\s*\[\d+\]:\s*time\s*:\s*(?P<time>\S+)\s*"
    r"host\s*:\s*(?P<host>\S+)\s*rank\s*:\s*(?P<rank>-?\d+) \(local_rank: (?P<local>-?\d+)\)\s*"
    r"exitcode\s*:\s*(?P<code>-?\d+)")
LOG_TAIL_LINES = 6
LOG_TAIL_CHARS = 300


def rank_log_tail(log_dir: str | os.PathLike | None, local_rank: int) -> str:
    """The last lines of one local rank's own log (stderr, else stdout) under torchrun's
    ``--log-dir`` (<log_dir>/<run id>/attempt_<n>/<local rank>/), latest attempt; '' if none."""
    if not log_dir:
        return ""
    for stream in ("stderr.log", "stdout.log"):
        logs = sorted(Path(log_dir).glob(f"*/attempt_*/{local_rank}/{stream}"),
                      key=lambda f: f.stat().st_mtime)
        text = logs[-1].read_text(errors="replace").strip() if logs else ""
        if text:
            tail = " | ".join(line.strip() for line in text.splitlines()[-LOG_TAIL_LINES:])
            return tail[-LOG_TAIL_CHARS:]
    return ""


def first_failure(output: str, log_dir: str | os.PathLike | None = None) -> RankFailure | None:
    """The first rank to fail, from torchrun's summary in ``output``; None when there is none (the
    agent itself failed, e.g. a rendezvous that never completed)."""
    causes = sorted(_ROOT_CAUSE_RE.finditer(output), key=lambda m: m["time"])
    if not causes:
        return None
    m = causes[0]
    host = m["host"]
    if host in ("localhost", "127.0.0.1", "::1"):  # a standalone agent names no node: this one
        host = this_node()
    return RankFailure(int(m["rank"]), int(m["local"]), host, int(m["code"]),
                       rank_log_tail(log_dir, int(m["local"])))


def forkrun_failure(log_dir: str | os.PathLike | None) -> RankFailure | None:
    """The first failure a one-node launch (gpulab.forkrun) recorded; None when there is none."""
    f = forkrun.read_failure(log_dir)
    if f is None:
        return None
    return RankFailure(f["rank"], f["local_rank"], this_node(),
                       f["exitcode"], rank_log_tail(log_dir, f["local_rank"]))


def failure_message(module: str, nproc: int, node: NodeSpec, rc: int, stdout: str,
                    stderr: str, failure: RankFailure | None = None) -> str:
    """What went wrong, first line first: which rank failed first, where, how, and its own log's
    last lines (a failed check's note keeps only the start), then torchrun's output."""
    from gpulab import slurm

    head = f"{module} failed on {nproc} rank(s) (exit {rc})"
    if node.nnodes > 1:
        _, names = slurm.failure_summary(stdout + "\n" + stderr)
        head = f"{module} failed on {node.nnodes} nodes x {nproc} rank(s) (exit {rc}): {names}"
    if failure is not None:
        head = f"{head}; {failure.describe()}" if node.nnodes == 1 else \
            f"{module}: {failure.describe()}\n{head}"
    return f"{head}\n{stdout[-3000:]}\n{stderr[-6000:]}"


class RankFailed(LaunchError):
    """A launch in which a rank failed; ``failure`` names it (None when torchrun named none)."""

    def __init__(self, message: str, failure: RankFailure | None):
        super().__init__(message)
        self.failure = failure


def collect(out_dir: Path, module: str, node: NodeSpec) -> RankResults:
    """The gathered results global rank 0 wrote (see :func:`gather_to_rank0`)."""
    f = out_dir / "ranks.json"
    if not f.exists():
        if node.node_rank != 0:
            raise NotResultNode(f"{module}: node rank {node.node_rank} finished; node 0 holds "
                                "every rank's results")
        raise LaunchError(f"{module}: rank 0 wrote no results ({f} missing)")
    gathered = json.loads(f.read_text())
    return RankResults([g["out"] for g in gathered], [g["placement"] for g in gathered])


def record_placement(result, ranks: RankResults) -> None:
    """Provenance of a (multi-node) run in ``result``: every node's host and device ids, and a
    ``placement`` table with one row per global rank."""
    import pandas as pd

    nodes: dict[str, list[str]] = {}
    for p in ranks.placement:
        nodes.setdefault(p["host"], []).append(p["device_id"])
    result.attrs["hosts"] = json.dumps(list(nodes))
    result.attrs["node_device_ids"] = json.dumps(nodes)
    result.add_table("placement", pd.DataFrame(ranks.placement))


def run_workers(module: str, payload: Mapping[str, Any], nproc: int, *, node: NodeSpec = NodeSpec(),
                env: Mapping[str, str] | None = None, timeout: float = 1800,
                multicast: bool = False) -> list[dict]:
    """Run ``module`` on ``nproc`` ranks per node and return every rank's result (global rank
    order, all nodes) as :class:`RankResults`. On a node other than 0 of a multi-node run started
    by hand, raises :class:`NotResultNode`: node 0 holds the results.

    ``multicast``: leave NVLink multicast to NCCL's default (see :func:`multicast_allowed`).
    """
    if nproc < 1:
        raise LaunchError(f"nproc must be >= 1, got {nproc}")
    with tempfile.TemporaryDirectory(prefix="gpulab-launch-", dir=launch_dir(node)) as tmp:
        pfile = Path(tmp) / "payload.json"
        pfile.write_text(json.dumps(payload, default=str))
        logs = Path(tmp) / "logs"
        cmd = launch_cmd(module, ["--payload", str(pfile), "--out-dir", tmp], nproc, node,
                         log_dir=str(logs))
        child_env = {**os.environ, **({} if multicast else SAFE_ENV), **(env or {})}
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
            failure = forkrun_failure(logs) or first_failure(stdout + "\n" + stderr, logs)
            msg = failure_message(module, nproc, node, p.returncode, stdout, stderr, failure)
            if failure is not None:
                log.error("launch: %s: %s", module, failure.describe())
            if node.nnodes > 1:
                raise MultiNodeFailure(msg)
            raise RankFailed(msg, failure)
        results = collect(Path(tmp), module, node)
        if len(results) != nproc * node.nnodes:
            raise LaunchError(f"{module}: expected {nproc * node.nnodes} rank results, "
                              f"got {len(results)}")
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
    """Join the process group the launcher set up (env://); one device per local rank."""
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


def placement(ctx: WorkerContext) -> dict:
    ids = [i for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip()]
    if ctx.is_cuda:
        device_id = ids[ctx.local_rank] if ctx.local_rank < len(ids) else str(ctx.local_rank)
    else:
        device_id = f"cpu:{ctx.local_rank}"
    return {"rank": ctx.rank, "host": this_node(),
            "node_rank": int(os.environ.get("GROUP_RANK", 0)), "local_rank": ctx.local_rank,
            "device": str(ctx.device), "device_id": device_id}


def gather_to_rank0(ctx: WorkerContext, out: dict) -> list[dict] | None:
    """Every rank's ``out`` and placement on global rank 0 (None elsewhere): one node writes one
    result, whichever node each rank ran on."""
    import torch.distributed as dist

    mine = {"out": out, "placement": placement(ctx)}
    if not dist.is_initialized() or ctx.world_size == 1:
        return [mine]
    objs: list | None = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(mine, objs, dst=0)
    return objs


def worker_main(fn: Callable[[WorkerContext, dict], dict], backend: str = "auto") -> None:
    import argparse

    ap = argparse.ArgumentParser(description="gpulab worker (started by gpulab.forkrun or torchrun)")
    ap.add_argument("--payload", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args()
    # The agent starts workers in sessions of their own; if it is killed, nothing else stops them.
    lifetime.die_with_parent(signal.SIGKILL)
    payload = json.loads(args.payload.read_text())
    ctx = init_distributed(payload.get("backend", backend))
    try:
        gathered = gather_to_rank0(ctx, fn(ctx, payload))
    finally:
        shutdown()
    if ctx.rank == 0:
        tmp = args.out_dir / ".ranks.json.tmp"
        tmp.write_text(json.dumps(gathered, default=float))
        os.replace(tmp, args.out_dir / "ranks.json")
