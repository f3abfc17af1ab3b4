"""Multi-node launch inside one SLURM allocation: one torchrun agent per node, started by ``srun``.

A stage set to ``devices.nodes.nnodes: N`` runs as ONE SLURM job of N nodes. Its command runs once,
on the batch host; :func:`gpulab.launch.run_workers` sees the allocation and, instead of a local
``torchrun``, starts ``srun`` with one task per node. Each task is the agent of
:mod:`gpulab.slurm_agent`, which asks SLURM where it is and starts ``torchrun`` with a static
rendezvous:

- node rank  = ``SLURM_NODEID``
- node count = ``SLURM_NNODES``
- rendezvous = first host of ``SLURM_STEP_NODELIST`` (``scontrol show hostnames``), port chosen by
  the batch host and passed on the command line

so nothing about node identity lives in the config. A failure on one node ends the whole step:
``srun --kill-on-bad-exit=1`` stops the other nodes when one agent exits non-zero, the static
rendezvous gives up after the join timeout when a node never arrives, and each agent that fails
prints a :data:`MARK` line naming its host, which :func:`failure_summary` turns into the error.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from typing import Mapping

MARK = "gpulab-node-failed"
STOPPED = "gpulab-node-stopped"
# srun's own report of a task that failed, e.g. "srun: error: node2: task 1: Exited with exit code 1".
_SRUN_ERR = re.compile(r"srun: error: ([\w.-]+): tasks? [\d,-]+: (.+)")
_MARK_RE = re.compile(rf"{MARK} host=(\S+) node_rank=(\d+) exit=(-?\d+) t=([\d.]+)")
_STOPPED_RE = re.compile(rf"{STOPPED} host=(\S+)")
# Seconds srun waits after the first task ends before it stops the rest (a healthy node's agent
# finishes within moments of the others; a stuck one must not hold the allocation).
END_GRACE_S = 30


def short_host() -> str:
    return socket.gethostname().split(".")[0]


def in_allocation(env: Mapping[str, str] | None = None) -> bool:
    """True inside a SLURM job (batch script or step) where ``srun`` can start tasks."""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_ID")) and shutil.which("srun") is not None


def hostnames(nodelist: str) -> list[str]:
    p = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                       timeout=30)
    if p.returncode != 0 or not p.stdout.split():
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} failed: {p.stderr.strip()}")
    return p.stdout.split()


def srun_cmd(nnodes: int, nproc: int, port: int, join_timeout: int, module: str,
             args: list[str]) -> list[str]:
    return ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", f"--wait={END_GRACE_S}", "--export=ALL", "--mpi=none",
            # The Snakemake job step may already hold the CPUs this step needs.
            "--overlap",
            sys.executable, "-m", "gpulab.slurm_agent", "--nproc", str(nproc), "--port", str(port),
            "--join-timeout", str(join_timeout), "--", module, *args]


def failure_summary(output: str) -> tuple[list[str], str]:
    """(failed hosts, first to fail first; text naming them) from the agents' and srun's output."""
    marks = sorted(((float(t), host, int(rank), int(code))
                    for host, rank, code, t in _MARK_RE.findall(output)))
    hosts: list[str] = []
    lines = []
    for _, host, rank, code in marks:
        if host not in hosts:
            hosts.append(host)
            lines.append(f"node {host} (node rank {rank}): torchrun exited with {code}")
    stopped = set(_STOPPED_RE.findall(output))
    for host, what in _SRUN_ERR.findall(output):
        # srun names a node whose agent never got as far as torchrun (bad environment, lost node);
        # the nodes srun itself stopped after that are not failures of their own.
        if host not in hosts and host not in stopped and not re.search("Killed|Terminated", what):
            hosts.append(host)
            lines.append(f"node {host}: {what.strip()}")
    if not hosts:
        return [], "no node reported a failure (srun itself failed; see its output below)"
    text = f"first failure on node {hosts[0]}"
    if len(hosts) > 1:
        text += f" (then {', '.join(hosts[1:])})"
    return hosts, text + ":\n  " + "\n  ".join(lines)
