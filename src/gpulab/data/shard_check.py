"""Does H5Dataset + DistributedSampler give every rank its own samples? Run on N ranks:

    python -m gpulab.data.shard_check --path set.h5 --nproc 3

Each rank reads its shard through a DataLoader (with worker processes), identifies every sample it
got by content (the test file stores the sample id in ``x[i, 0]``), and the ranks all-gather their
ids to check that no sample is read by two ranks and (unless ``drop_last``) none is missed.
"""
from __future__ import annotations

import argparse
import json

from gpulab import launch


def _worker(ctx: launch.WorkerContext, payload: dict) -> dict:
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from gpulab.data.api import H5Dataset

    ds = H5Dataset(payload["path"])
    drop_last = bool(payload.get("drop_last", False))
    sampler = DistributedSampler(ds, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                 seed=int(payload.get("seed", 0)), drop_last=drop_last)
    loader = DataLoader(ds, batch_size=int(payload.get("batch_size", 16)), sampler=sampler,
                        num_workers=int(payload.get("num_workers", 0)))
    ids, labels_ok = [], True
    for x, y in loader:
        flat = x.reshape(len(x), -1)
        ids += [int(v) for v in flat[:, 0].tolist()]
        labels_ok &= bool((y == (flat[:, 0].long() % ds.num_classes)).all())
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, ids)
    union = [i for r in every for i in r]
    return {"rank": ctx.rank, "ids": ids, "sampler_len": len(sampler), "labels_ok": labels_ok,
            "n": len(ds), "disjoint": len(union) == len(set(union)),
            "complete": set(union) == set(range(len(ds)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpulab.data.shard_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--drop-last", action="store_true")
    args = ap.parse_args(argv)
    res = launch.run_workers("gpulab.data.shard_check",
                             {"path": args.path, "drop_last": args.drop_last, "backend": "gloo"},
                             args.nproc)
    print(json.dumps([{k: v for k, v in r.items() if k != "ids"} for r in res], indent=1))
    return 0 if all(r["disjoint"] for r in res) else 1


if __name__ == "__main__":
    import sys

    if "--payload" in sys.argv:
        launch.worker_main(_worker)
    else:
        raise SystemExit(main())
