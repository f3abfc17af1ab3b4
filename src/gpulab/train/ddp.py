"""Variant ``ddp`` (one torchrun rank per device): DistributedDataParallel swept over the number
of devices (strong and weak scaling), global batch, gradient bucket size and communication hook;
the learning-rate scaling rule with warm-up; and the equivalence check against single-device
training on the same global batch.

Device-count sweeps run inside one launch: the first k ranks form a sub-group and train while the
others wait at a barrier, so every k is measured on the same processes.
"""
from __future__ import annotations

from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpulab import launch
from gpulab.outcomes import Check
from gpulab.train import data, loop, models


def device_counts(requested, world: int) -> list[int]:
    """Powers of two up to the world size, plus the world size ('all'), or the given list."""
    if requested == "all":
        ks, k = [], 1
        while k < world:
            ks.append(k)
            k *= 2
        return ks + [world]
    bad = [k for k in requested if k > world]
    if bad:
        raise ValueError(f"train.device_counts {bad} exceed the {world} device(s) available")
    return sorted(set(requested))


def wrap(model, ctx: launch.WorkerContext, group, bucket_mb: float, hook: str, powersgd_rank: int):
    ids = [ctx.device.index] if ctx.is_cuda else None
    ddp = DDP(model, device_ids=ids, process_group=group, bucket_cap_mb=bucket_mb)
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        # start_powerSGD_iter=2: plain all-reduce for the first step (error feedback needs one),
        # then compressed; the warm-up steps cover that switch.
        state = ps.PowerSGDState(process_group=group, matrix_approximation_rank=powersgd_rank,
                                 start_powerSGD_iter=2)
        ddp.register_comm_hook(state, ps.powerSGD_hook)
    elif hook != "none":
        raise ValueError(f"unknown comm hook {hook!r} (known: none, fp16, powersgd)")
    return ddp


def measure_config(ctx, cfg, ds, group, k, name, local_batch, bucket_mb, hook) -> dict:
    """Time one DDP configuration on this rank (a member of ``group`` of k ranks)."""
    dev = ctx.device
    loop.seed_everything(cfg.seed)  # same init on every rank (DDP also broadcasts rank 0's)
    model = models.build_classifier(name, cfg.mlp_hidden).to(dev)
    ddp = wrap(model, ctx, group, bucket_mb, hook, cfg.powersgd_rank)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    rank = dist.get_rank(group)
    batches = data.EpochBatches(ds, local_batch, rank=rank, replicas=k, seed=cfg.seed)
    loop.reset_peak([dev])
    warmup = max(cfg.warmup, 2 if hook == "powersgd" else 0)
    stats, losses = loop.run_timed(lambda: loop.timed_step(ddp, opt, batches, dev), warmup,
                                   cfg.repeats)
    row = {"model": name, "devices": k, "local_batch": local_batch, "global_batch": k * local_batch,
           "bucket_cap_mb": bucket_mb, "comm_hook": hook, **loop.stats_row(stats, k * local_batch),
           "peak_mem_bytes": loop.peak_bytes(dev), "final_loss": losses[-1]}
    # Same steps without gradient synchronisation: the difference in backward time is the
    # communication that backward could not hide (exposed all-reduce).
    # (The model is thrown away after this, so unsynchronised updates do no harm.)
    with ddp.no_sync():
        nosync, _ = loop.run_timed(lambda: loop.timed_step(ddp, opt, batches, dev), 0,
                                   cfg.repeats)
    row["backward_nosync_s"] = nosync["backward"].median
    row["comm_exposed_s"] = max(0.0, row["backward_s"] - row["backward_nosync_s"])
    return row


def sweep(ctx, cfg, ds) -> list[dict]:
    world = ctx.world_size
    counts = device_counts(cfg.device_counts, world)
    groups = {k: (dist.new_group(list(range(k))) if k < world else dist.group.WORLD) for k in counts}
    configs = []  # (k, model, local batch, bucket, hook, sweep name)
    for name in cfg.models:
        for k in counts:
            for g in cfg.global_batches:
                if g % k == 0:
                    configs.append((k, name, g // k, cfg.bucket_cap_mb[0], "none", "strong"))
            configs.append((k, name, cfg.per_device_batch, cfg.bucket_cap_mb[0], "none", "weak"))
        for bucket in cfg.bucket_cap_mb:
            for hook in cfg.comm_hooks:
                configs.append((world, name, cfg.per_device_batch, bucket, hook, "comm"))
    rows = []
    for k, name, b, bucket, hook, kind in configs:
        if ctx.rank < k:
            row = measure_config(ctx, cfg, ds, groups[k], k, name, b, bucket, hook)
            rows.append({"sweep": kind, "rank": ctx.rank, **row})
        dist.barrier()
    return rows


def equivalence(ctx, cfg, ds, name: str) -> dict | None:
    """DDP on all ranks vs one model trained on the union of their batches, in float64.

    Each rank's loss is the mean over its local batch and DDP averages gradients over ranks, so
    the update equals that of the mean loss over the global batch (equal local batch sizes). With a
    sum loss DDP would still average, giving 1/N of the single-device gradient.
    """
    dev, k, b, steps = ctx.device, ctx.world_size, cfg.equivalence_batch, cfg.equivalence_steps
    loop.seed_everything(cfg.seed)
    model = models.build_classifier(name, cfg.mlp_hidden, dropout=0.0).double().to(dev)
    ref = None
    if ctx.rank == 0:
        loop.seed_everything(cfg.seed)
        ref = models.build_classifier(name, cfg.mlp_hidden, dropout=0.0).double().to(dev)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    ddp = wrap(model, ctx, None, cfg.bucket_cap_mb[0], "none", 1)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    batches = data.EpochBatches(ds, b, rank=ctx.rank, replicas=k, seed=cfg.seed)
    if batches.steps_per_epoch() < steps:
        raise ValueError(f"train.equivalence_steps={steps} exceeds one epoch "
                         f"({batches.steps_per_epoch()} steps of {b} per rank)")
    loss_err = 0.0
    for step in range(steps):
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(ddp(x.double().to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= k
        if ref is not None:
            idx = data.global_batch_indices(len(ds), k, b, step, seed=cfg.seed)
            xs, ys = zip(*ds.__getitems__(idx))
            rl = torch.nn.functional.cross_entropy(ref(torch.stack(xs).double().to(dev)),
                                                   torch.stack(ys).to(dev))
            rl.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            loss_err = max(loss_err, loop.rel_err(mean_loss, rl))
    if ref is None:
        return None
    err = loop.max_rel_err(model.parameters(), ref.parameters())
    tol = cfg.equivalence_tolerance
    return asdict(Check.of(f"ddp({k}) == single device, global batch {k * b} ({name}, float64, "
                           f"{steps} SGD steps, max rel. param error)", "ddp",
                           err <= tol and loss_err <= tol, value=err, bound=tol,
                           note=f"loss rel. error {loss_err:.3g} (bound {tol:g})"))


def sampler_check(ctx, cfg, ds) -> dict | None:
    """DistributedSampler: shards are disjoint and cover the data; set_epoch changes the order."""
    s = torch.utils.data.DistributedSampler(ds, num_replicas=ctx.world_size, rank=ctx.rank,
                                            seed=cfg.seed, drop_last=True)
    s.set_epoch(0)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    shards = [None] * ctx.world_size
    dist.all_gather_object(shards, e0)
    if ctx.rank != 0:
        return None
    flat = [i for sh in shards for i in sh]
    ok = len(flat) == len(set(flat)) == ctx.world_size * (len(ds) // ctx.world_size) and e0 != e1
    return asdict(Check.of("DistributedSampler shards disjoint, cover the data; set_epoch "
                           "reshuffles", "ddp", ok, value=len(set(flat)),
                           note="value: distinct sample indices over all shards of epoch 0"))


def lr_scaling(ctx, cfg, ds) -> list[dict]:
    """Train on all ranks with base lr, lr x N, and lr x N with warm-up; loss per step."""
    k, b, dev = ctx.world_size, cfg.curve_batch, ctx.device
    name = cfg.models[0]
    settings = [("base lr", False, 0), ("lr x N", True, 0), ("lr x N + warm-up", True, cfg.lr_warmup_steps)]
    out = []
    for label, scale, wsteps in settings:
        loop.seed_everything(cfg.seed)
        model = models.build_classifier(name, cfg.mlp_hidden).to(dev)
        ddp = wrap(model, ctx, None, cfg.bucket_cap_mb[0], "none", 1)
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        batches = data.EpochBatches(ds, b, rank=ctx.rank, replicas=k, seed=cfg.seed)
        for step in range(cfg.curve_epochs * batches.steps_per_epoch()):
            lr = loop.lr_at(step, cfg.lr, k, scale, wsteps)
            loop.set_lr(opt, lr)
            _, loss = loop.timed_step(ddp, opt, batches, dev)
            t = torch.tensor([loss], device=dev)
            dist.all_reduce(t)
            out.append({"model": name, "setting": label, "devices": k, "global_batch": k * b,
                        "step": step, "epoch": batches.epoch, "lr": lr, "loss": float(t) / k})
    return out if ctx.rank == 0 else []


def worker(ctx: launch.WorkerContext, payload: dict) -> dict:
    cfg = payload["cfg"]
    ds = data.open_digits(payload["data"])
    checks = [c for c in [sampler_check(ctx, cfg, ds)] if c]
    rows = sweep(ctx, cfg, ds)
    for name in cfg.models:
        c = equivalence(ctx, cfg, ds, name)
        if c:
            checks.append(c)
    curves = lr_scaling(ctx, cfg, ds)
    return {"rows": rows, "checks": checks, "curves": curves, "device": str(ctx.device),
            "backend": ctx.backend}
