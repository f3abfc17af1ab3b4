"""Is distributed execution working here? All-reduce a known tensor on N ranks and check the sum.

    python -m gpulab.launch_check --nproc 2      # gloo on CPU, NCCL on GPUs
"""
from __future__ import annotations

import argparse
import json

from gpulab import launch


def _worker(ctx: launch.WorkerContext, payload: dict) -> dict:
    import torch
    import torch.distributed as dist

    n = int(payload.get("numel", 1024))
    x = torch.arange(n, dtype=torch.float64, device=ctx.device) + ctx.rank
    dist.all_reduce(x)
    expected = torch.arange(n, dtype=torch.float64) * ctx.world_size + sum(range(ctx.world_size))
    return {"rank": ctx.rank, "world_size": ctx.world_size, "backend": ctx.backend,
            "device": str(ctx.device), "ok": bool(torch.equal(x.cpu(), expected)),
            "checksum": float(x.sum().item())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpulab.launch_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args(argv)
    res = launch.run_workers("gpulab.launch_check", {"numel": 4096}, args.nproc)
    print(json.dumps(res, indent=1))
    return 0 if all(r["ok"] for r in res) else 1


if __name__ == "__main__":
    import sys

    if "--payload" in sys.argv:
        launch.worker_main(_worker)
    else:
        raise SystemExit(main())
