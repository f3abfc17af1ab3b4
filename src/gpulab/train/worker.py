"""torchrun entry point of the multi-process variants: ``payload['mode']`` picks the strategy."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

from gpulab import launch

# What each strategy's ranks import on first use. gpulab.forkrun imports it once, before it forks
# the ranks (preload), instead of once per rank: 0.5-1.1 CPU-s each (torch._dynamo 1.1, pipelining
# 1.0, tensor parallel 0.5 beyond it), a large part of a small rank's work on a CPU host.
# tests/test_train.py names any torch module a rank still imports by itself.
STRATEGY_IMPORTS = {
    # DistributedDataParallel() and DTensor's entry points import torch._dynamo on first call
    "ddp": ["gpulab.train.ddp", "torch._dynamo",
            "torch.distributed.algorithms.ddp_comm_hooks.default_hooks",
            "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"],
    "pipeline": ["gpulab.train.pipeline", "torch.distributed.pipelining"],
    "tensor": ["gpulab.train.tensor", "torch.distributed.device_mesh",
               "torch.distributed.tensor.parallel", "torch._dynamo"],
}
# every strategy's forward opens record_function regions, which look for the CUPTI monitor once
EVERY_STRATEGY_IMPORTS = ["torch.profiler._cupti_monitor"]


def preload(args: list[str]) -> None:
    """gpulab.forkrun's hook: import, before the fork, what the ranks of this launch's strategy
    (``payload['mode']`` of the ``--payload`` file in ``args``) will import."""
    payload = json.loads(Path(args[args.index("--payload") + 1]).read_text())
    for name in [*STRATEGY_IMPORTS.get(payload.get("mode"), []), *EVERY_STRATEGY_IMPORTS]:
        try:
            importlib.import_module(name)
        except ImportError:  # not in this torch release: the ranks do without it, or import it
            pass


def dispatch(ctx: launch.WorkerContext, payload: dict) -> dict:
    from gpulab.train import loop
    from gpulab.train.settings import Settings

    # The section crossed as JSON: each rank reads the same typed view the stage read.
    payload = {**payload, "cfg": Settings.from_section(payload["cfg"])}
    loop.seed_everything(payload["cfg"].seed + ctx.rank)  # every rank seeded explicitly
    mode = payload["mode"]
    if mode == "ddp":
        from gpulab.train.ddp import worker
    elif mode == "pipeline":
        from gpulab.train.pipeline import worker
    elif mode == "tensor":
        from gpulab.train.tensor import worker
    else:
        raise ValueError(f"unknown train worker mode {mode!r}")
    return worker(ctx, payload)


if __name__ == "__main__":
    launch.worker_main(dispatch)
