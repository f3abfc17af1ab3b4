"""torchrun entry point of the multi-process variants: ``payload['mode']`` picks the strategy."""
from __future__ import annotations

from gpulab import launch


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
