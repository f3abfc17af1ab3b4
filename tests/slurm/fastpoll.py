"""`python -m snakemake`, with the remote executor's status polls at most POLL_S seconds apart.

The SLURM executor plugin backs off 10 s more after every poll that finds no job finished (up to
180 s): right for a shared cluster's controller, but on the tests' private cluster a job of ~15 s
is noticed ~35 s after it starts, and the suite's SLURM files spent most of their time waiting.
What they test is the jobs' placement and results, not the plugin's poll cadence.

    python tests/slurm/fastpoll.py --profile workflow/profiles/slurm ...
"""
from __future__ import annotations

import runpy

from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

POLL_S = 2

_prop = RemoteExecutor.next_seconds_between_status_checks
RemoteExecutor.next_seconds_between_status_checks = property(
    _prop.fget, lambda self, value: _prop.fset(self, min(value, POLL_S)))

if __name__ == "__main__":
    runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
