"""Variant ``pipeline`` (one torchrun rank per stage): TinyGPT split into p contiguous stages,
trained with ``torch.distributed.pipelining`` under the GPipe and 1F1B schedules, swept over the
number of micro-batches m. The bubble is measured and set against GPipe's (p-1)/(m+p-1).

Measured bubble of a rank = 1 - busy / step, where busy = m x (forward + backward time of that
rank's stage on one micro-batch, timed alone) and step = the schedule's step time. Communication
and scheduling overhead therefore count as bubble.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from gpulab import launch, timing
from gpulab.train import data, loop, models

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def build(cfg, gcfg, ctx, schedule: str, m: int):
    from torch.distributed import pipelining

    p, rank = ctx.world_size, ctx.rank
    loop.seed_everything(cfg["seed"])  # the whole model is built identically on every rank
    full = models.TinyGPT(gcfg)
    mod = models.pipeline_stage_module(full, rank, p).to(ctx.device)
    stage = pipelining.PipelineStage(mod, rank, p, ctx.device)
    # scale_grads=True: gradients are averaged over micro-batches (= the full-batch mean loss).
    sched = getattr(pipelining, SCHEDULES[schedule])(stage, m, loss_fn=models.lm_loss, scale_grads=True)
    opt = torch.optim.SGD(mod.parameters(), lr=cfg["lr"])
    return mod, sched, opt


def run_schedule(ctx, sched, x, y) -> list:
    """One pipelined forward+backward: the first stage feeds inputs, the last gets targets."""
    p, rank, losses = ctx.world_size, ctx.rank, []
    args = (x.to(ctx.device),) if rank == 0 else ()
    kw = {"target": y.to(ctx.device), "losses": losses} if rank == p - 1 else {}
    sched.step(*args, **kw)
    return losses


def check(ctx, cfg, gcfg, schedule, m, x, y) -> dict:
    """Pipeline gradients and loss vs the unsplit model on the whole batch (float32)."""
    mod, sched, _ = build(cfg, gcfg, ctx, schedule, m)
    losses = run_schedule(ctx, sched, x, y)
    loop.seed_everything(cfg["seed"])
    ref = models.TinyGPT(gcfg).to(ctx.device)
    ref_loss = models.lm_loss(ref(x.to(ctx.device)), y.to(ctx.device))
    ref_loss.backward()
    ref_mod = models.pipeline_stage_module(ref, ctx.rank, ctx.world_size)
    err = loop.max_rel_err([q.grad for q in mod.parameters()], [q.grad for q in ref_mod.parameters()])
    loss_err = loop.rel_err(torch.stack(losses).mean(), ref_loss) if losses else 0.0
    return {"grad_rel_err": err, "loss_rel_err": loss_err}


def stage_busy(ctx, cfg, gcfg, mod, mb: int) -> timing.Stats:
    """Forward + backward of this rank's stage alone on one micro-batch (no communication)."""
    dev, p, rank = ctx.device, ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(cfg["seed"] + rank)
    if rank == 0:
        inp = torch.randint(gcfg.vocab, (mb, gcfg.seq_len), generator=g).to(dev)
    else:
        inp = torch.randn(mb, gcfg.seq_len, gcfg.d_model, generator=g).to(dev).requires_grad_()
    tgt = torch.randint(gcfg.vocab, (mb, gcfg.seq_len), generator=g).to(dev)

    def fb():
        out = mod(inp)
        if rank == p - 1:
            models.lm_loss(out, tgt).backward()
        else:
            out.backward(torch.ones_like(out))

    def clear():
        mod.zero_grad(set_to_none=True)

    return timing.measure(fb, warmup=cfg["warmup"], repeats=cfg["repeats"],
                          device=dev if ctx.is_cuda else None, setup=clear)


def worker(ctx: launch.WorkerContext, payload: dict) -> dict:
    cfg = payload["cfg"]
    gcfg = models.GPTConfig(**cfg["gpt"])
    p, B = ctx.world_size, cfg["pipeline_batch"]
    xs, ys = data.synthetic_tokens(4 * B, gcfg.seq_len, gcfg.vocab, cfg["seed"])
    batches = [(xs[i * B:(i + 1) * B], ys[i * B:(i + 1) * B]) for i in range(4)]
    rows = []
    for schedule in cfg["schedules"]:
        for m in cfg["microbatches"]:
            base = {"schedule": schedule, "stages": p, "microbatches": m, "global_batch": B,
                    "micro_batch": B // m, "rank": ctx.rank}
            if schedule == "1f1b" and m < p:
                rows.append({**base, "note": f"1F1B needs m >= p ({m} < {p}): not run"})
                continue
            chk = check(ctx, cfg, gcfg, schedule, m, *batches[0])
            mod, sched, opt = build(cfg, gcfg, ctx, schedule, m)
            it = iter(range(10**9))
            last_losses: list = []

            def step():
                nonlocal last_losses
                x, y = batches[next(it) % len(batches)]
                last_losses = run_schedule(ctx, sched, x, y)

            def between():  # untimed: apply the update, line the ranks up
                opt.step()
                opt.zero_grad(set_to_none=True)
                dist.barrier()

            loop.reset_peak([ctx.device])
            st = timing.measure(step, warmup=cfg["warmup"], repeats=cfg["repeats"],
                                sync=ctx.sync if ctx.is_cuda else None, setup=between)
            peak = loop.peak_bytes(ctx.device)
            busy = stage_busy(ctx, cfg, gcfg, mod, B // m)
            rows.append({**base, "step_s_median": st.median, "step_s_min": st.min,
                         "step_s_max": st.max, "repeats": st.n, "samples_per_s": B / st.median,
                         "stage_fb_s": busy.median, "busy_s": m * busy.median,
                         "bubble_measured": 1 - m * busy.median / st.median,
                         "bubble_gpipe": loop.gpipe_bubble(p, m), "peak_mem_bytes": peak,
                         "loss": float(torch.stack(last_losses).mean()) if last_losses else float("nan"),
                         **chk, "note": ""})
            dist.barrier()
    return {"rows": rows, "device": str(ctx.device), "backend": ctx.backend}
