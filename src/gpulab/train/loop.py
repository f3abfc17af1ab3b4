"""Pieces every strategy shares: seeding, the learning-rate rule, a phase-timed training step,
peak memory per device, and the summary rows the result tables are made of."""
from __future__ import annotations

import random
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from gpulab import timing

PHASES = ("data", "forward", "backward", "optimizer")


def seed_everything(seed: int) -> None:
    """Every rank calls this with an explicit seed (model init seeds are the same on all ranks)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def lr_at(step: int, base_lr: float, n_devices: int, scale: bool, warmup_steps: int) -> float:
    """Linear scaling rule (lr x N for N devices, seed ch. 1) with a linear warm-up from base_lr.

    During warm-up the rate climbs from ``base_lr`` to the target over ``warmup_steps`` steps, so
    large-batch training starts with a small learning rate as the seed recommends.
    """
    target = base_lr * (n_devices if scale else 1)
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def sync_fn(devices) -> Callable[[], None] | None:
    """Wait for every CUDA device in ``devices`` (one device or several): a step that runs on
    several GPUs from one process (DataParallel, naive model parallel) ends when the last does."""
    if isinstance(devices, torch.device):
        devices = [devices]
    cuda = sorted({d for d in devices if d.type == "cuda"}, key=lambda d: d.index or 0)
    if not cuda:
        return None

    def sync():
        for d in cuda:
            torch.cuda.synchronize(d)
    return sync


def timed_step(model, opt, batches, device, loss_fn=F.cross_entropy,
               input_hook: Callable | None = None,
               sync_devices=None) -> tuple[dict[str, float], float]:
    """One optimisation step timed phase by phase (host clock, every device in ``sync_devices``
    (default: ``device``) synchronised at each boundary, so a phase includes the device work it
    launched). Returns (phases, loss)."""
    sw = timing.Stopwatch(sync=sync_fn(sync_devices if sync_devices is not None else device))
    with sw.phase("data"):
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    with sw.phase("forward"):
        out = model(input_hook(x) if input_hook else x)
        loss = loss_fn(out, y.to(out.device))
    with sw.phase("backward"):
        loss.backward()
    with sw.phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return dict(sw.phases), float(loss.detach())


def reset_peak(devices) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)


def peak_bytes(device: torch.device) -> float:
    """Peak bytes allocated by torch on a CUDA device since the last reset; NaN on CPU (torch keeps
    no per-device allocator statistics for host memory)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float("nan")


def run_timed(step: Callable[[], tuple[dict[str, float], float]], warmup: int,
              repeats: int) -> tuple[dict[str, timing.Stats], list[float]]:
    """Warm-up steps, then ``repeats`` timed steps: per-phase and total Stats, and every loss."""
    losses = []
    for _ in range(warmup):
        losses.append(step()[1])
    samples: dict[str, list[float]] = {}
    for _ in range(repeats):
        phases, loss = step()
        losses.append(loss)
        for k, v in phases.items():
            samples.setdefault(k, []).append(v)
        samples.setdefault("step", []).append(sum(phases.values()))
    return {k: timing.summarize(v) for k, v in samples.items()}, losses


def stats_row(stats: dict[str, timing.Stats], samples_per_step: int) -> dict:
    """Flat row: step time median/min/max, each phase's median, samples/s at the median."""
    st = stats["step"]
    row = {"step_s_median": st.median, "step_s_min": st.min, "step_s_max": st.max,
           "repeats": st.n, "samples_per_s": samples_per_step / st.median}
    for k, s in stats.items():
        if k != "step":
            row[f"{k}_s"] = s.median
    return row


def gpipe_bubble(p: int, m: int) -> float:
    """GPipe's idle fraction (p-1)/(m+p-1) for p equal stages and m micro-batches."""
    return (p - 1) / (m + p - 1)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a-b| / max(|b|, tiny): the relative error bound the equivalence checks use."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def max_rel_err(tensors_a, tensors_b) -> float:
    """Largest |a-b| over a whole set of tensors, relative to the largest |b| in the set: some
    gradients are zero in exact arithmetic (a key bias), so a per-tensor ratio would be noise."""
    pairs = list(zip(tensors_a, tensors_b, strict=True))
    diff = max(float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max()) for a, b in pairs)
    scale = max(float(b.detach().double().abs().max()) for _, b in pairs)
    return diff / max(scale, 1e-30)
