"""Independent kernel jobs spread over GPUs by Snakemake and ``gpulab-slot``.

Each job (``resources: gpu=1``) runs the divide kernel on the one GPU its slot gave it for at least
``jobs.seconds`` and records the ids it held (``CUDA_VISIBLE_DEVICES``/``GPULAB_DEVICE_IDS``) and
its wall-clock start and end. The aggregation reads all jobs and shows from those records whether
the jobs were spread over the devices and ran at the same time. On a host without GPUs the jobs get
no ids (recorded as such) and run the CPU kernel; their concurrency is then bounded by ``--cores``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpulab import outcomes, results, slots, timing
from gpulab.kernels import divide
from gpulab.kernels.bars import job_checks
from gpulab.kernels.settings import Settings
from gpulab.outcomes import Check

# What the jobs' columns count, beside their units (gpulab.outcomes.units_for).
JOB_NOTES = {"gbps": "read+write", "startup_s": "interpreter start to the first timed call"}


def _process_start() -> float:
    """Unix time this job's interpreter started (its imports and set-up follow)."""
    import psutil

    return psutil.Process().create_time()


class _Job:
    """The job's device, buffers and kernel call, built with as little as the kernel needs: CuPy
    where CuPy does the work (a RawKernel on a CUDA host), numpy on CPU. torch is imported only for
    the ``torch`` kernel: its import alone was most of a 0.5 s job's start-up (issue 28)."""

    def __init__(self, ctx, cfg: Settings, n: int, seed: int):
        dev = ctx.devices_config
        self.device = _cupy_device(dev.get("backend", "auto"))
        if self.device is None:
            from gpulab.devices import cpu_devices

            self.device = cpu_devices(int(dev.get("cpu_devices", 2)))[0]
        self.variant = divide.kernel_for(self.device.kind, cfg.kernel)
        self.img = divide.make_image(n, seed=seed)
        self.ref = divide.reference(self.img, cfg.divisor)
        div, block = cfg.divisor, cfg.block
        if self.device.kind == "cpu":
            self.inp, self.out = self.img, np.uint8(255) - self.ref
            self.call = divide.divider(self.variant, self.out, self.inp, div, block)
            self.timer = None
        elif self.variant in divide.RAW_VARIANTS:
            import cupy as cp

            with cp.cuda.Device(self.device.index):
                self.inp, self.out = cp.asarray(self.img), cp.asarray(np.uint8(255) - self.ref)
            self.call = _cupy_divider(self.variant, self.out, self.inp, self.device.index, div,
                                      block)
            self.timer = _cupy_timer(self.device.index)
        else:  # the library kernel on CUDA: torch is the work
            import torch

            tdev = self.device.torch_device
            self.inp = torch.from_numpy(self.img).to(tdev)
            self.out = torch.from_numpy(np.uint8(255) - self.ref).to(tdev)
            self.call = divide.divider(self.variant, self.out, self.inp, div, block)
            self.timer = None
            self._tdev = tdev

    def measure(self, warmup: int, repeats: int) -> list[float]:
        if self.timer is not None:
            return self.timer(self.call, warmup, repeats)
        tdev = getattr(self, "_tdev", None)
        return list(timing.measure(self.call, warmup=warmup, repeats=repeats, device=tdev).samples)

    def verified(self) -> bool:
        out = self.out
        if hasattr(out, "get"):  # CuPy
            out = out.get()
        elif hasattr(out, "cpu"):  # torch
            out = out.cpu().numpy()
        return bool(np.array_equal(out, self.ref))


def _cupy_device(backend: str):
    """This job's one CUDA device through CuPy (no torch), or None where there is none to use."""
    from gpulab.devices import Device

    if backend == "cpu":
        return None
    try:
        import cupy as cp

        count = cp.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, or CUDA_VISIBLE_DEVICES hides every GPU
        count = 0
    if count == 0:
        if backend == "cuda":
            raise RuntimeError("backend 'cuda' was requested but CuPy sees no CUDA GPU "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        return None
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return Device("cuda", 0, name, int(props["totalGlobalMem"]), visible[0] if visible else "0")


def _cupy_divider(variant: str, out, inp, dev: int, div: int, block: int):
    """``out = inp // div`` by the RawKernel ``variant`` on CuPy arrays, prepared up front."""
    import cupy as cp

    n = int(inp.size)
    g = divide.geometry(n, divide.WIDTH[variant], block)
    with cp.cuda.Device(dev):
        kern = divide._raw_kernel(variant)
    args = (inp, out, np.uint64(n), np.int32(divide.check_divisor(div)))

    def call():
        with cp.cuda.Device(dev):
            kern((g.blocks,), (g.block,), args)

    return call


def _cupy_timer(dev: int):
    """Times calls with CUDA events on CuPy's current stream (what timing.measure does with
    torch's): ``warmup`` untimed calls, then one event pair per call."""
    import cupy as cp

    def measure(fn, warmup: int, repeats: int) -> list[float]:
        with cp.cuda.Device(dev):
            for _ in range(warmup):
                fn()
            cp.cuda.get_current_stream().synchronize()
            samples = []
            for _ in range(repeats):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        return samples

    return measure


def run_job(ctx, index: int) -> results.Result:
    """One independent job: the kernel on this job's single device for ``jobs.seconds``."""
    cfg = ctx.settings
    jc = cfg.jobs
    launch = _process_start()
    start = time.time()
    n = jc.bytes
    job = _Job(ctx, cfg, n, seed=1000 + index)
    device, variant = job.device, job.variant
    samples: list[float] = []
    t_kernel = time.time()
    # Start-up: interpreter start to the first timed call (imports, device, buffers, compile).
    startup = t_kernel - launch
    # Keep the device busy long enough that overlapping jobs are visible in their intervals.
    while not samples or time.time() - t_kernel < jc.seconds:
        samples += job.measure(warmup=1, repeats=cfg.repeats)
    verified = job.verified()
    end = time.time()
    st = timing.summarize(samples)
    ids = os.environ.get(slots.IDS_ENV, "")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    row = {"job": index, "device_ids": ids, "cuda_visible_devices": visible or "",
           "device": device.label, "device_name": device.name, "kernel": variant, "bytes": n,
           "launch_unix": launch, "start_unix": start, "end_unix": end,
           "duration_s": end - start, "startup_s": startup, "calls": len(samples),
           "gbps": 2 * n / st.median / 1e9, "verified": verified, "pid": os.getpid()}
    r = ctx.new_result(device.kind, job_index=index, cuda_visible_devices=str(visible),
                       host_gpu_pool=slots.pool_ids(), start_unix=start, end_unix=end,
                       startup_s=startup,
                       note="" if ids else "no GPU ids: this job ran on a CPU host (CPU kernel)")
    job_df = pd.DataFrame([row])
    r.add_table("job", job_df, units=outcomes.units_for(job_df, JOB_NOTES))
    r.add_table(outcomes.CHECKS, outcomes.checks_frame([
        Check.of("output exact vs numpy", f"job {index}: {variant}, {n} B", verified)]))
    return r


def max_concurrency(starts, ends) -> int:
    """Most intervals open at once (an end at the same instant as a start does not overlap)."""
    events = sorted([(e, -1) for e in ends] + [(s, 1) for s in starts])
    level = best = 0
    for _, step in events:
        level += step
        best = max(best, level)
    return best


def aggregate(ctx, paths: list[Path]) -> results.Result:
    """The ``jobs`` result: every job's record, the spread over devices and the concurrency."""
    if not paths:
        raise ValueError("kernels jobs aggregation: no job results given (--jobs is empty)")
    frames, pools, kinds = [], [], set()
    for p in paths:
        a = results.read_attrs(p)
        frames.append(results.read_table(p, "job"))
        pools.append(a.get("host_gpu_pool") or [])
        kinds.add(a["device_kind"])
    jobs = pd.concat(frames, ignore_index=True).sort_values("job").reset_index(drop=True)
    t0 = jobs["launch_unix"].min()
    for c in ("launch", "start", "end"):
        jobs[f"{c}_s"] = jobs[f"{c}_unix"] - t0
    k = len(jobs)
    pool = max(pools, key=len)
    with_ids = jobs[jobs["device_ids"] != ""]
    used = sorted(set(",".join(with_ids["device_ids"]).split(","))) if len(with_ids) else []
    # A job holds its GPU id from before its process starts until after it ends, so its process
    # interval [launch, end] is when it occupied the device; [start, end] is its kernel work alone.
    conc = max_concurrency(jobs["launch_unix"], jobs["end_unix"])
    kconc = max_concurrency(jobs["start_unix"], jobs["end_unix"])
    busy = float((jobs["end_unix"] - jobs["launch_unix"]).sum())
    makespan = float(jobs["end_unix"].max() - t0)
    per_device = (jobs.assign(ids=jobs["device_ids"].replace("", "none (CPU host)"))
                  .groupby("ids").agg(jobs=("job", "count"), kernel_s=("duration_s", "sum"))
                  .reset_index().rename(columns={"ids": "device_ids"}))
    summary = pd.DataFrame([{
        "jobs": k, "host_gpus": len(pool), "devices_used": len(used),
        "max_concurrency": conc, "max_kernel_concurrency": kconc, "makespan_s": makespan,
        "busy_s": busy, "mean_concurrency": busy / makespan if makespan > 0 else float("nan"),
    }])
    kind = "cuda" if "cuda" in kinds else "cpu"
    r = ctx.new_result(kind, jobs=k, host_gpu_pool=pool, devices_used=used)
    since = "from the first job's launch"
    r.add_table("jobs", jobs, units=outcomes.units_for(jobs, {**JOB_NOTES, "launch_s": since,
                                                              "start_s": since, "end_s": since}))
    r.add_table("per_device", per_device, units=outcomes.units_for(per_device))
    r.add_table("summary", summary, units=outcomes.units_for(summary, {
        "max_concurrency": "processes, launch to end", "max_kernel_concurrency": "kernel work, start to end",
        "busy_s": "sum of launch to end", "mean_concurrency": "busy / makespan"}))
    checks, na = job_checks(k, len(pool), len(used), conc, kconc)
    checks += [Check.of("output exact vs numpy", f"job {int(j.job)}", bool(j.verified))
               for j in jobs.itertuples()]
    r.add_table(outcomes.CHECKS, outcomes.checks_frame(checks))
    r.add_table(outcomes.NOT_APPLICABLE, outcomes.not_applicable_frame(na))
    return r
