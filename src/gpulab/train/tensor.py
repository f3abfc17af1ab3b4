"""Variant ``tensor`` (one torchrun rank per device): TinyGPT with Megatron-style tensor
parallelism ("layer split", seed chapter 6): column-parallel q/k/v and fc1, row-parallel attention
projection and fc2 on a 1-D DeviceMesh over all ranks, against the unsplit model on one device."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from gpulab import launch, timing
from gpulab.train import data, loop, models


def grads(model) -> list[torch.Tensor]:
    """Full (unsharded) gradients, in parameter order."""
    out = []
    for p in model.parameters():
        g = p.grad
        out.append(g.full_tensor() if hasattr(g, "full_tensor") else g)
    return out


def time_training(ctx, cfg, model, x, y, barrier: bool) -> timing.Stats:
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, foreach=False)  # DTensor + Tensor mix

    def step():
        models.lm_loss(model(x), y).backward()
        opt.step()

    def between():
        opt.zero_grad(set_to_none=True)
        if barrier:  # line the ranks up so each timed step starts together
            dist.barrier()

    return timing.measure(step, warmup=cfg.warmup, repeats=cfg.repeats,
                          device=ctx.device if ctx.is_cuda else None, setup=between)


def worker(ctx: launch.WorkerContext, payload: dict) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    cfg, dev, n = payload["cfg"], ctx.device, ctx.world_size
    gcfg = models.GPTConfig(**cfg.gpt.as_section())
    if gcfg.n_heads % n:
        raise ValueError(f"train.gpt.n_heads={gcfg.n_heads} is not divisible by the {n} "
                         "tensor-parallel ranks")
    mesh = init_device_mesh(dev.type, (n,))
    loop.seed_everything(cfg.seed)
    ref = models.TinyGPT(gcfg).to(dev)
    tp = parallelize_module(copy.deepcopy(ref), mesh, models.tensor_parallel_plan(ref))

    xs, ys = data.synthetic_tokens(max(cfg.tensor_batches), gcfg.seq_len, gcfg.vocab, cfg.seed)
    x, y = xs[:8].to(dev), ys[:8].to(dev)
    tp_loss = models.lm_loss(tp(x), y)
    tp_loss.backward()
    ref_loss = models.lm_loss(ref(x), y)
    ref_loss.backward()
    chk = {"grad_rel_err": loop.max_rel_err(grads(tp), grads(ref)),
           "loss_rel_err": loop.rel_err(tp_loss, ref_loss)}
    tp.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)

    rows = []
    for b in cfg.tensor_batches:
        xb, yb = xs[:b].to(dev), ys[:b].to(dev)
        for kind, model, devices in (("unsplit", ref, 1), ("tensor_parallel", tp, n)):
            alone = kind == "unsplit"  # rank 0 alone trains the unsplit baseline; others wait
            if not alone or ctx.rank == 0:
                loop.reset_peak([dev])
                st = time_training(ctx, cfg, model, xb, yb, barrier=not alone)
                rows.append({"mode": kind, "devices": devices, "global_batch": b, "rank": ctx.rank,
                             "step_s_median": st.median, "step_s_min": st.min,
                             "step_s_max": st.max, "repeats": st.n, "samples_per_s": b / st.median,
                             "peak_mem_bytes": loop.peak_bytes(dev),
                             "params_local": sum(_local(p).numel() for p in model.parameters())})
            dist.barrier()
    return {"rows": rows, "checks": chk, "device": str(dev), "backend": ctx.backend}


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else p
