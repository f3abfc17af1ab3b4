"""Variant ``pipeline`` (one torchrun rank per stage): TinyGPT split into p contiguous stages,
trained with ``torch.distributed.pipelining`` under the GPipe and 1F1B schedules, swept over the
number of micro-batches m. The bubble is measured and set against GPipe's (p-1)/(m+p-1).

Measured bubble of a rank = 1 - busy / step, where busy is the time this rank spent inside its
stage's forward, loss and backward calls *during the timed steps themselves*, and step is the
schedule's step time. Busy is a sum of disjoint sub-intervals of the step, so the bubble lies in
[0, 1); communication and scheduling overhead count as bubble. For GPipe the ranks' mean bubble is
at least (p-1)/(m+p-1): equal to it when the stages are balanced, more when they are not. One
rank's own can be less: the busiest stage (here the last, which also holds the head and the loss)
idles less than the others.

Why not time the stage alone (as this did before): the stage's forward+backward run alone, after
the sweep and with one warm-up call, on other threads' leftovers, has little to do with what the
same call costs inside the schedule; on a shared 2-core host it came out several times longer
than a whole step, so busy > step and every bubble was negative (-8.3 ... -0.4).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from gpulab import launch, timing
from gpulab.train import data, loop, models

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def build(cfg, gcfg, ctx, schedule: str, m: int):
    from torch.distributed import pipelining

    p, rank = ctx.world_size, ctx.rank
    loop.seed_everything(cfg.seed)  # the whole model is built identically on every rank
    full = models.TinyGPT(gcfg)
    mod = models.pipeline_stage_module(full, rank, p).to(ctx.device)
    stage = pipelining.PipelineStage(mod, rank, p, ctx.device)
    # scale_grads=True: gradients are averaged over micro-batches (= the full-batch mean loss).
    sched = getattr(pipelining, SCHEDULES[schedule])(stage, m, loss_fn=models.lm_loss, scale_grads=True)
    opt = torch.optim.SGD(mod.parameters(), lr=cfg.lr)
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
    loop.seed_everything(cfg.seed)
    ref = models.TinyGPT(gcfg).to(ctx.device)
    ref_loss = models.lm_loss(ref(x.to(ctx.device)), y.to(ctx.device))
    ref_loss.backward()
    ref_mod = models.pipeline_stage_module(ref, ctx.rank, ctx.world_size)
    err = loop.max_rel_err([q.grad for q in mod.parameters()], [q.grad for q in ref_mod.parameters()])
    loss_err = loop.rel_err(torch.stack(losses).mean(), ref_loss) if losses else 0.0
    return {"grad_rel_err": err, "loss_rel_err": loss_err}


class BusyClock:
    """Time spent in this rank's compute calls of the schedule (forward, loss, backward).

    Host clock on CPU; CUDA events on the current stream on GPUs (resolved after the step's sync),
    so the sum never includes time the stream sat waiting for a receive.
    """

    def __init__(self, ctx, stage, sched):
        self.cuda = ctx.is_cuda
        self.steps: list[list] = []
        self.on = False
        for obj, name in ((stage, "forward_one_chunk"), (stage, "backward_one_chunk"),
                          (sched, "_maybe_compute_loss")):
            self._wrap(obj, name)

    def _wrap(self, obj, name):
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(*args, **kwargs)
                end.record()
                self.steps[-1].append((start, end))
            else:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self.steps[-1].append(time.perf_counter() - t0)
            return out

        setattr(obj, name, timed)

    def start_step(self):
        self.on = True
        self.steps.append([])

    def stop_step(self):
        self.on = False

    def busy(self, last: int) -> list[float]:
        """Busy seconds of each of the ``last`` steps."""
        out = []
        for spans in self.steps[-last:]:
            if self.cuda:
                torch.cuda.synchronize()
                out.append(sum(s.elapsed_time(e) for s, e in spans) / 1e3)
            else:
                out.append(sum(spans))
        return out


def busy_and_bubble(busy: list[float], steps: list[float]) -> tuple[float, float]:
    """Median busy seconds and median idle share of the timed steps, per step first (busy and step
    of the same step belong together). ``timing``'s median, the one of the step times (the mean of
    the middle two for an even count): with any other convention a rank busy for less than each of
    its steps could read as busy longer than its median step."""
    bubbles = [1 - b / t for b, t in zip(busy, steps)]
    return timing.summarize(busy).median, timing.summarize(bubbles).median


def worker(ctx: launch.WorkerContext, payload: dict) -> dict:
    cfg = payload["cfg"]
    gcfg = models.GPTConfig(**cfg.gpt.as_section())
    p, B = ctx.world_size, cfg.pipeline_batch
    xs, ys = data.synthetic_tokens(4 * B, gcfg.seq_len, gcfg.vocab, cfg.seed)
    batches = [(xs[i * B:(i + 1) * B], ys[i * B:(i + 1) * B]) for i in range(4)]
    rows = []
    for schedule in cfg.schedules:
        for m in cfg.microbatches:
            base = {"schedule": schedule, "stages": p, "microbatches": m, "global_batch": B,
                    "micro_batch": B // m, "rank": ctx.rank}
            if schedule == "1f1b" and m < p:
                rows.append({**base, "note": f"1F1B needs m >= p ({m} < {p}): not run"})
                continue
            chk = check(ctx, cfg, gcfg, schedule, m, *batches[0])
            mod, sched, opt = build(cfg, gcfg, ctx, schedule, m)
            clock = BusyClock(ctx, sched._stage, sched)
            it = iter(range(10**9))
            last_losses: list = []

            def step():
                nonlocal last_losses
                x, y = batches[next(it) % len(batches)]
                clock.start_step()
                last_losses = run_schedule(ctx, sched, x, y)
                clock.stop_step()

            def between():  # untimed: apply the update, line the ranks up
                opt.step()
                opt.zero_grad(set_to_none=True)
                dist.barrier()

            loop.reset_peak([ctx.device])
            st = timing.measure(step, warmup=cfg.warmup, repeats=cfg.repeats,
                                sync=ctx.sync if ctx.is_cuda else None, setup=between)
            peak = loop.peak_bytes(ctx.device)
            busy_med, bubble_med = busy_and_bubble(clock.busy(st.n), st.samples)
            rows.append({**base, "step_s_median": st.median, "step_s_min": st.min,
                         "step_s_max": st.max, "repeats": st.n, "samples_per_s": B / st.median,
                         "stage_fb_s": busy_med / m, "busy_s": busy_med,
                         "bubble_measured": bubble_med,
                         "bubble_gpipe": loop.gpipe_bubble(p, m), "peak_mem_bytes": peak,
                         "loss": float(torch.stack(last_losses).mean()) if last_losses else float("nan"),
                         **chk, "note": ""})
            dist.barrier()
    return {"rows": rows, "device": str(ctx.device), "backend": ctx.backend}
