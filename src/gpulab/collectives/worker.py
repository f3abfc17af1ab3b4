"""One rank of the collectives benchmark (started through gpulab.launch).

Payload keys: ops, modes, sizes_bytes, algorithms, warmup, repeats, iters, seed, slice_bytes,
max_slices. Returns this rank's rows: per case the per-call seconds of every repetition and the
number of wrong elements it found when checking its own output.
"""
from __future__ import annotations

import logging

from gpulab import launch
from gpulab.collectives import handwritten, library
from gpulab.collectives.bench import measure_case
from gpulab.collectives.data import Patterns

log = logging.getLogger("gpulab.collectives")


def run_rank(ctx: launch.WorkerContext, payload: dict) -> dict:
    import torch
    import torch.distributed as dist

    n, rank = ctx.world_size, ctx.rank
    pats = Patterns(int(payload["seed"]), n, ctx.device)
    timing = {"device": ctx.device, "barrier": dist.barrier, "sync": ctx.sync,
              "warmup": int(payload["warmup"]), "repeats": int(payload["repeats"]),
              "iters": int(payload["iters"])}
    rows = []
    for op in payload["ops"]:
        for mode in payload["modes"]:
            for size in payload["sizes_bytes"]:
                case = library.make_case(op, mode, int(size), pats, rank, n)
                if case is not None:
                    rows.append(measure_case(case, **timing))
                    del case
    for alg in payload["algorithms"]:
        for size in payload["sizes_bytes"]:
            case = handwritten.make_case(alg, int(size), pats, rank, n, int(payload["slice_bytes"]),
                                         int(payload["max_slices"]))
            rows.append(measure_case(case, **timing))
            del case
    if ctx.is_cuda:
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(ctx.device) if ctx.is_cuda else "cpu"
    return {"rank": rank, "world_size": n, "backend": ctx.backend, "device": str(ctx.device),
            "device_name": name, "bus_id": _bus_id(ctx.device) if ctx.is_cuda else "",
            "rows": rows}


def _bus_id(device) -> str:
    """This rank's GPU's PCI bus id (for NVML's link table in the parent), '' when unknown."""
    import torch

    try:
        p = torch.cuda.get_device_properties(device)
        return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
    except (AttributeError, RuntimeError):
        return ""


if __name__ == "__main__":
    launch.worker_main(run_rank)
