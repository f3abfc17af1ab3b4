"""One torchrun agent per node of a multi-node SLURM step (``srun`` starts it; see
:mod:`gpulab.slurm`): it reads its place from SLURM's environment, runs ``torchrun`` with a static
rendezvous, forwards the signals srun sends, and marks a failure with its host name.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Mapping

from gpulab import launch, slurm
from gpulab.launch import NodeSpec


def node_from_env(port: int, env: Mapping[str, str] | None = None):
    """This agent's place in the step, from SLURM's environment only."""
    env = os.environ if env is None else env
    try:
        nnodes, node_rank = int(env["SLURM_NNODES"]), int(env["SLURM_NODEID"])
        nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
    except KeyError as exc:
        raise RuntimeError(f"not inside a SLURM job step: {exc.args[0]} is not set") from None
    return NodeSpec(nnodes, node_rank, slurm.hostnames(nodelist)[0], port)


def agent_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpulab.slurm_agent",
                                 description="one torchrun agent of a multi-node SLURM step")
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--join-timeout", type=int, required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    host = slurm.short_host()
    node = node_from_env(a.port)
    torchrun = launch.torchrun_cmd(cmd[0], cmd[1:], a.nproc, node, join_timeout=a.join_timeout)
    proc = subprocess.Popen(torchrun)
    stopped: list[int] = []

    def forward(signum, _frame):
        stopped.append(signum)
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    rc = proc.wait()
    if rc != 0 and stopped:
        # srun stopped us because another node failed (--kill-on-bad-exit): not this node's fault.
        print(f"{slurm.STOPPED} host={host} signal={stopped[0]}", file=sys.stderr, flush=True)
    elif rc != 0:
        print(f"{slurm.MARK} host={host} node_rank={node.node_rank} exit={rc} t={time.time():.3f}",
              file=sys.stderr, flush=True)
    return 0 if rc == 0 else (rc if rc > 0 else 128 - rc)


if __name__ == "__main__":
    raise SystemExit(agent_main())
