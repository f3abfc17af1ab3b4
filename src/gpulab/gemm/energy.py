"""Energy of the single-device bf16 GEMM (GFLOP/J, average W), measured by gpulab.energy."""
from __future__ import annotations

import torch

from gpulab import energy
from gpulab.gemm import numerics

COLUMNS = energy.COLUMNS

DTYPE = "bf16"
# On a CPU the datasheet size (8192^3) takes minutes per call; the meter needs >= 1 s, not that.
CPU_SIZE = 512


def size_for(device: torch.device, bar_size: int) -> int:
    return int(bar_size) if device.type == "cuda" else min(int(bar_size), CPU_SIZE)


def bf16_rows(device: torch.device, size: int, seed: int, precs) -> list[dict]:
    """One row: torch.matmul(out=) at size^3 in bf16, repeated for >= 1 s inside the meter."""
    size = size_for(device, size)
    op = f"GEMM {DTYPE} {size}^3, torch.matmul(out=)"
    dev = str(device)
    if DTYPE not in {p.name for p in precs}:
        return [energy.not_applicable_row(op, dev, f"{DTYPE} not supported on {dev}", "GFLOP")]
    meter, why = energy.torch_meter(device)
    if meter is None:
        return [energy.not_applicable_row(op, dev, why, "GFLOP")]
    try:
        return [_measure(device, size, seed, meter, op)]
    except Exception as exc:  # noqa: BLE001 - the energy row never takes the stage down
        return [energy.not_applicable_row(op, dev, f"energy measurement failed: {exc!r}", "GFLOP")]


def _measure(device, size: int, seed: int, meter, op: str) -> dict:
    prec = numerics.precision(DTYPE)
    a32, b32 = numerics.random_inputs(size, size, size, seed, device)
    a, b = a32.to(prec.dtype), b32.to(prec.dtype)
    del a32, b32
    out = torch.empty(size, size, dtype=prec.dtype, device=device)
    with numerics.matmul_mode(prec):
        r = energy.measure(lambda: torch.matmul(a, b, out=out), meter, energy.torch_sync(device))
    return energy.row(op, str(device), meter.name, 2.0 * size**3 / 1e9, "GFLOP", r)
