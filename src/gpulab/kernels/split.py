"""The image split over devices: one equal chunk per device, own streams, host buffers, async copies.

Per device and repetition the same program is enqueued: copy the chunk in, divide, copy it back,
with events in between, so each phase is timed per device like the seed's "Create Stream for Each
GPU" output (Copy To, Kernel, Copy Back, Execution Time, Component Time). Factors compared:

- ``threads``: one host thread enqueues for every device (``single``) or one thread per device
  (``per_device``);
- ``chunks``: 1 (copy in, kernel, copy out in turn) or K sub-chunks over two or more streams per
  device, so one sub-chunk's copies overlap another's kernel (pipelining);
- ``pinned``: page-locked host buffers (truly async copies) or pageable ones (CUDA only);
- ``devices``: all devices, and a single one for the speed-up when there are several.

Execution time (first event to last, per device) below the component time (sum of the phases)
means phases overlapped.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import product

import numpy as np
import pandas as pd

from gpulab import timing
from gpulab.devices import Device
from gpulab.kernels import divide
from gpulab.kernels.settings import Settings
from gpulab.kernels.streams import new_stream

log = logging.getLogger("gpulab.kernels")

PHASES = ("copy_to", "kernel", "copy_back", "component", "total")
ALIGN = 16  # chunk boundaries keep the 16-byte kernel's loads aligned


@dataclass(frozen=True)
class Mode:
    devices: int
    threads: str  # "single" | "per_device"
    chunks: int  # sub-chunks per device; 1 = no pipelining
    pinned: bool

    @property
    def name(self) -> str:
        pipe = f"pipelined x{self.chunks}" if self.chunks > 1 else "serial"
        mem = "pinned" if self.pinned else "pageable"
        return f"{self.devices} dev, {self.threads} thread(s), {pipe}, {mem}"


def chunk_ranges(n: int, parts: int, align: int = ALIGN) -> list[tuple[int, int]]:
    """``parts`` contiguous, nearly equal ranges covering [0, n); inner boundaries ``align``-ed."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts")
    bounds = [0] + [(i * n // parts) // align * align for i in range(1, parts)] + [n]
    ranges = list(zip(bounds[:-1], bounds[1:]))
    if any(b <= a for a, b in ranges):
        raise ValueError(f"{n} bytes are too few to split into {parts} chunks of at least "
                         f"{align} bytes; raise kernels.split.bytes")
    return ranges


def modes(n_devices: int, kind: str, cfg: Settings) -> list[Mode]:
    counts = sorted({1, n_devices})
    chunks = sorted({1, cfg.split.chunks})
    # Pinned memory is a CUDA notion: on CPU virtual devices host memory is device memory.
    pinned = list(cfg.split.pinned) if kind == "cuda" else [False]
    return [Mode(d, t, c, p) for d, t, c, p in
            product(counts, ("single", "per_device"), chunks, pinned)]


class DeviceWork:
    """Buffers, streams and the enqueued program of one device's chunk."""

    def __init__(self, device: Device, h_in, h_out, lo: int, hi: int, mode: Mode, cfg: Settings):
        import torch

        self.device = device
        n = hi - lo
        self.d_in = torch.empty(n, dtype=torch.uint8, device=device.torch_device)
        self.d_out = torch.empty_like(self.d_in)
        self.sub = chunk_ranges(n, mode.chunks)
        nstreams = 1 if mode.chunks == 1 else max(2, min(mode.chunks, cfg.split.streams))
        self.streams = [new_stream(device) for _ in range(nstreams)]
        variant = divide.kernel_for(device.kind, cfg.kernel)
        self.steps = []
        for a, b in self.sub:
            di, do = self.d_in[a:b], self.d_out[a:b]
            hi_, ho = h_in[lo + a:lo + b], h_out[lo + a:lo + b]
            self.steps.append((
                lambda di=di, hi_=hi_: di.copy_(hi_, non_blocking=True),
                divide.divider(variant, do, di, cfg.divisor, cfg.block),
                lambda ho=ho, do=do: ho.copy_(do, non_blocking=True),
            ))
        self.marks = None

    def enqueue(self) -> None:
        main = self.streams[0]
        start = main.record()
        for s in self.streams[1:]:
            s.wait_event(start)
        marks = []
        for j, (copy_to, kernel, copy_back) in enumerate(self.steps):
            s = self.streams[j % len(self.streams)]
            e = [s.record()]
            for op in (copy_to, kernel, copy_back):
                s.submit(op)
                e.append(s.record())
            marks.append(e)
        for s in self.streams[1:]:
            main.wait_event(s.record())
        self.marks = (start, marks, main.record())

    def synchronize(self) -> None:
        for s in self.streams:
            s.synchronize()

    def run(self) -> None:
        self.enqueue()
        self.synchronize()

    def phases(self) -> dict[str, float]:
        start, marks, end = self.marks
        out = {p: sum(e[i].seconds_until(e[i + 1]) for e in marks)
               for i, p in enumerate(PHASES[:3])}
        out["component"] = sum(out[p] for p in PHASES[:3])
        out["total"] = start.seconds_until(end)
        return out

    def close(self) -> None:
        for s in self.streams:
            s.close()


def _host_buffers(img: np.ndarray, pinned: bool):
    import torch

    h_in = torch.from_numpy(img)
    h_out = torch.empty(len(img), dtype=torch.uint8, pin_memory=pinned)
    return (h_in.pin_memory() if pinned else h_in), h_out


def run_mode(devices: list[Device], buffers, ref: np.ndarray, mode: Mode, cfg: Settings):
    """(phase rows, wall-clock Stats, verified) of one mode; ``buffers``: (host in, host out)."""
    import torch

    devs = devices[:mode.devices]
    h_in, h_out = buffers
    ranges = chunk_ranges(len(ref), len(devs))
    works = [DeviceWork(d, h_in, h_out, lo, hi, mode, cfg) for d, (lo, hi) in zip(devs, ranges)]
    pool = ThreadPoolExecutor(len(works)) if mode.threads == "per_device" else None
    wrong = torch.from_numpy(np.uint8(255) - ref)

    def once() -> float:
        t0 = time.perf_counter()
        if pool is None:  # one host thread enqueues everything, then waits for everything
            for w in works:
                w.enqueue()
            for w in works:
                w.synchronize()
        else:
            for f in [pool.submit(w.run) for w in works]:
                f.result()
        return time.perf_counter() - t0

    rows, walls = [], []
    try:
        for _ in range(cfg.warmup):
            once()
        for rep in range(cfg.repeats):
            if rep == cfg.repeats - 1:
                h_out.copy_(wrong)  # untimed: the verified repetition must write every byte
            walls.append(once())
            for w in works:
                for phase, sec in w.phases().items():
                    rows.append({"device": w.device.label, "device_name": w.device.name,
                                 "rep": rep, "phase": phase, "time_s": sec})
        verified = bool(np.array_equal(h_out.numpy(), ref))
    finally:
        if pool:
            pool.shutdown()
        for w in works:
            w.close()
    return rows, timing.summarize(walls), verified


def run_split(devices: list[Device], cfg: Settings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tables ``split`` (one row per mode) and ``split_phases`` (per mode, device and phase)."""
    n = cfg.split.bytes
    img = divide.make_image(n, seed=7)
    ref = divide.reference(img, cfg.divisor)
    summary, phase_rows = [], []
    todo = modes(len(devices), devices[0].kind, cfg)
    # Host buffers once per memory kind: pinning a large buffer costs more than the runs.
    buffers = {p: _host_buffers(img, p) for p in sorted({m.pinned for m in todo})}
    for mode in todo:
        rows, wall, ok = run_mode(devices, buffers[mode.pinned], ref, mode, cfg)
        df = pd.DataFrame(rows)
        comp = df[df.phase == "component"].groupby("device")["time_s"].median()
        tot = df[df.phase == "total"].groupby("device")["time_s"].median()
        summary.append({"mode": mode.name, "devices": mode.devices, "threads": mode.threads,
                        "chunks": mode.chunks, "pinned": mode.pinned, "bytes": n,
                        **wall.as_dict("wall_s"), "gbps": n / wall.median / 1e9,
                        "overlap": float((comp / tot).mean()), "verified": ok})
        for (dev, name, phase), g in df.groupby(["device", "device_name", "phase"], sort=False):
            st = timing.summarize(g["time_s"].tolist())
            phase_rows.append({"mode": mode.name, "devices": mode.devices, "threads": mode.threads,
                               "chunks": mode.chunks, "pinned": mode.pinned, "device": dev,
                               "device_name": name, "phase": phase, **st.as_dict("time_s")})
        _log_like_seed(mode, phase_rows[-len(PHASES) * mode.devices:], wall, ok)
    return pd.DataFrame(summary), pd.DataFrame(phase_rows)


def _log_like_seed(mode: Mode, rows: list[dict], wall: timing.Stats, ok: bool) -> None:
    label = {"copy_to": "Copy To", "kernel": "Kernel", "copy_back": "Copy Back",
             "total": "Execution Time", "component": "Component Time"}
    log.info("split: %s (wall %.2f ms)", mode.name, wall.median * 1e3)
    for r in rows:
        log.info("  ID: %s %s %-15s: %.3f ms", r["device"], r["device_name"], label[r["phase"]],
                 r["time_s_median"] * 1e3)
    log.info("  Array check %s", "passed" if ok else "FAILED")


# What the split table's columns count, beside their units (gpulab.outcomes.units_for).
SPLIT_NOTES = {"gbps": "image bytes / wall time", "overlap": "component / execution time"}
