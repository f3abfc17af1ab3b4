"""Variant ``single``: one process. Single device, ``nn.DataParallel``, naive model parallel and
the seed's chapter-8 techniques (freezing layers, activations/parameters to CPU and back), swept
over the global batch, with loss curves."""
from __future__ import annotations

import torch
import torch.nn as nn

from gpulab.outcomes import Check
from gpulab.train import data, loop, models

DP_CPU_NOTE = ("no CUDA device: nn.DataParallel has no device_ids and calls the module as is, so "
               "this is single-device training (same code path)")


class SaveActivationsOnCPU(nn.Module):
    """Forward under ``save_on_cpu``: tensors saved for backward go to host memory and come back
    when backward needs them (pinned when the model is on a GPU)."""

    def __init__(self, model: nn.Module, pin: bool):
        super().__init__()
        self.model, self.pin = model, pin

    def forward(self, x):
        with torch.autograd.graph.save_on_cpu(pin_memory=self.pin):
            return self.model(x)


def offload_parameters(model: nn.Module, opt: torch.optim.Optimizer, device: torch.device):
    """Keep the feature layers' parameters in host memory between steps: moved to ``device`` by a
    forward pre-hook, back to the CPU after the optimizer step (their grads are dropped first)."""
    parts = model.feature_layers()
    cpu = torch.device("cpu")

    def to_device(_module, _args):
        for p in parts:
            p.to(device, non_blocking=True)

    def to_host(_opt, _args, _kwargs):
        for p in parts:
            for q in p.parameters():
                q.grad = None
            p.to(cpu)

    model.register_forward_pre_hook(to_device)
    opt.register_step_post_hook(to_host)
    to_host(None, None, None)


def make(cfg: dict, name: str, strategy: str, devs: list[torch.device], seed: int):
    """Model (wrapped for ``strategy``), its optimizer, the input device, the devices it runs on
    (the step timer waits for all of them) and a note."""
    loop.seed_everything(seed)
    base = models.build_classifier(name, cfg.mlp_hidden)
    dev, note, used = devs[0], "", [devs[0]]
    if strategy == "naive_mp":
        model = models.NaiveModelParallel(base, devs)
        used = list(dict.fromkeys(devs))
        if len(used) == 1:
            note = "one device: both halves on it, the .to() hops are no-ops"
    else:
        base.to(dev)
        model = base
    if strategy == "data_parallel":
        ids = [d.index for d in devs] if dev.type == "cuda" else None
        model = nn.DataParallel(base, device_ids=ids)
        used = list(dict.fromkeys(devs)) if ids else [dev]
        note = DP_CPU_NOTE if ids is None else f"{len(ids)} GPU thread(s) (scatter, replicate, gather)"
    elif strategy == "freeze":
        for layer in base.feature_layers():
            layer.requires_grad_(False)
        note = "feature layers frozen: no gradients computed or applied for them"
    elif strategy == "offload_activations":
        model = SaveActivationsOnCPU(base, pin=dev.type == "cuda")
        note = "" if dev.type == "cuda" else "on CPU the activations already live in host memory"
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    if strategy == "offload_params":
        offload_parameters(base, opt, dev)
        note = "" if dev.type == "cuda" else "on CPU the moves to/from host memory are no-ops"
    return model, opt, dev, used, note


STRATEGIES = ("single", "data_parallel", "naive_mp")
TECHNIQUES = ("freeze", "offload_activations", "offload_params")


def run_single(cfg: dict, dataset, devices) -> dict:
    """All rows of the ``single`` variant: {'throughput': [...], 'loss_curve': [...], 'checks': [...]}."""
    devs = [d.torch_device for d in devices]
    seed, warmup, repeats = cfg.seed, cfg.warmup, cfg.repeats
    rows, curves, checks = [], [], []
    for name in cfg.models:
        for b in cfg.batch_sizes:
            for strategy in STRATEGIES + (TECHNIQUES if b == max(cfg.batch_sizes) else ()):
                model, opt, dev, used, note = make(cfg, name, strategy, devs, seed)
                batches = data.EpochBatches(dataset, b, seed=seed)
                loop.reset_peak(set(devs))
                stats, losses = loop.run_timed(
                    lambda: loop.timed_step(model, opt, batches, dev, sync_devices=used),
                    warmup, repeats)
                rows.append({"model": name, "strategy": strategy, "global_batch": b,
                             "devices": len(used),
                             **loop.stats_row(stats, b),
                             "peak_mem_bytes": max(loop.peak_bytes(d) for d in set(devs)),
                             "final_loss": losses[-1], "note": note})
        checks.append(naive_mp_check(cfg, name, devs, dataset, seed))
        curves += loss_curves(cfg, name, dataset, devs[0], seed)
    return {"throughput": rows, "loss_curve": curves, "checks": checks}


def naive_mp_check(cfg, name, devs, dataset, seed) -> Check:
    """The split model computes exactly what the unsplit one does (same init, same input)."""
    loop.seed_everything(seed)
    plain = models.build_classifier(name, cfg.mlp_hidden).to(devs[0])
    loop.seed_everything(seed)
    split = models.NaiveModelParallel(models.build_classifier(name, cfg.mlp_hidden), devs)
    x = torch.stack([dataset[i][0] for i in range(min(64, len(dataset)))]).to(devs[0])
    with torch.no_grad():
        err = loop.rel_err(split(x).to(devs[0]), plain(x))
    tol = cfg.equivalence_tolerance
    return Check.within(f"naive_mp == unsplit ({name}, forward)", "single", err, tol,
                        note="max |a-b| / max |b| of the logits")


def loss_curves(cfg, name, dataset, dev, seed) -> list[dict]:
    """Loss per step for plain training and for freezing the feature layers after some steps."""
    b = cfg.curve_batch
    out = []
    for strategy, freeze_at in (("single", None), ("freeze_after", cfg.freeze_after_steps)):
        loop.seed_everything(seed)
        model = models.build_classifier(name, cfg.mlp_hidden).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        batches = data.EpochBatches(dataset, b, seed=seed)
        steps = cfg.curve_epochs * batches.steps_per_epoch()
        for step in range(steps):
            if step == freeze_at:
                for layer in model.feature_layers():
                    layer.requires_grad_(False)
            _, loss = loop.timed_step(model, opt, batches, dev)
            out.append({"model": name, "strategy": strategy, "step": step, "epoch": batches.epoch,
                        "loss": loss, "lr": cfg.lr})
    return out
