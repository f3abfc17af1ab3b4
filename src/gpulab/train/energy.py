"""Energy of a single-device training step (J/sample, samples/J, average W), measured by
gpulab.energy, one row per model.

The step is the timed one (:func:`gpulab.train.loop.timed_step`: next batch of the real training
set and its copy to the device, forward with the loss, backward, SGD step), at the sweep's largest
batch, on a fresh model and optimizer built from the same seed after the timed runs: nothing timed
or checked shares state with it. The meter reads the training device only (NVML: the GPU, not the
host that loads the batches; RAPL: the CPU packages, other processes included).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from gpulab import energy, outcomes
from gpulab.train.settings import Settings

COLUMNS = energy.COLUMNS


def operation(model: str, batch: int) -> str:
    # The report's energy figure titles a panel by the text before the first comma.
    return f"training step {model}, batch {batch} (data, forward, backward, SGD step)"


def step_rows(cfg: Settings, dataset, device: torch.device) -> list[dict]:
    """One row per model of ``cfg.models``: its training step repeated for >= 1 s inside the
    meter, work = batch samples per step; not_applicable (with the reason) where there is no
    meter or the measurement failed."""
    batch = max(cfg.batch_sizes)
    meter, why = energy.torch_meter(device)
    rows = []
    for name in cfg.models:
        op = operation(name, batch)
        if meter is None:
            rows.append(energy.not_applicable_row(op, str(device), why, "sample"))
            continue
        try:
            rows.append(_measure(cfg, name, batch, dataset, device, meter, op))
        except Exception as exc:  # noqa: BLE001 - the energy row never takes the stage down
            rows.append(energy.not_applicable_row(op, str(device),
                                                  f"energy measurement failed: {exc!r}", "sample"))
    return rows


def _measure(cfg: Settings, name: str, batch: int, dataset, device, meter, op: str) -> dict:
    from gpulab.train import data, loop, single

    model, opt, dev, _, _ = single.make(cfg, name, "single", [device], cfg.seed)
    batches = data.EpochBatches(dataset, batch, seed=cfg.seed)
    losses: list[float] = []

    def step():
        # sync_devices=(): no synchronisation at the phase boundaries (the stopwatch's, which
        # only the timed sweep needs); reading the loss still waits for the step's work, and
        # energy.measure synchronises the device before it reads the clock.
        losses.append(loop.timed_step(model, opt, batches, dev, sync_devices=())[1])

    r = energy.measure(step, meter, energy.torch_sync(dev))
    bad = sum(not math.isfinite(x) for x in losses)
    if bad:  # a diverged step is not a training step's energy
        r = dataclasses.replace(r, resolved=False,
                                note=f"{bad} of {len(losses)} steps gave a non-finite loss")
    return energy.row(op, str(dev), meter.name, float(batch), "sample", r)


def add_table(result, cfg: Settings, dataset, device: torch.device) -> None:
    """The single variant's ``energy`` table."""
    import pandas as pd

    df = pd.DataFrame(step_rows(cfg, dataset, device), columns=COLUMNS)
    result.add_table("energy", df, outcomes.units_for(df))
