"""Timers with warm-up and repetitions, reported as median with min/max spread.

On CUDA devices time is taken with CUDA events on the device's current stream (host clocks would
measure launch, not execution); on CPU with ``time.perf_counter``.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass(frozen=True)
class Stats:
    """Summary of repeated timings, in seconds."""

    median: float
    min: float
    max: float
    mean: float
    stdev: float
    samples: tuple[float, ...] = field(repr=False)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: the relative run-to-run spread."""
        return (self.max - self.min) / self.median if self.median > 0 else float("nan")

    def as_dict(self, prefix: str = "time_s") -> dict:
        return {
            f"{prefix}_median": self.median,
            f"{prefix}_min": self.min,
            f"{prefix}_max": self.max,
            f"{prefix}_mean": self.mean,
            f"{prefix}_stdev": self.stdev,
            "repeats": self.n,
        }


def summarize(samples: Sequence[float]) -> Stats:
    if not samples:
        raise ValueError("no samples to summarize")
    s = [float(x) for x in samples]
    return Stats(
        median=statistics.median(s),
        min=min(s),
        max=max(s),
        mean=statistics.fmean(s),
        stdev=statistics.stdev(s) if len(s) > 1 else 0.0,
        samples=tuple(s),
    )


def _cuda_time_once(fn: Callable[[], object], device, batch: int = 1) -> float:
    import torch

    with torch.cuda.device(device):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / batch


def _cpu_time_once(fn: Callable[[], object], sync: Callable[[], object] | None,
                   batch: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(batch):
        fn()
    if sync is not None:
        sync()
    return (time.perf_counter() - t0) / batch


def measure(
    fn: Callable[[], object],
    *,
    warmup: int = 2,
    repeats: int = 5,
    device=None,
    sync: Callable[[], object] | None = None,
    setup: Callable[[], object] | None = None,
    batch: int = 1,
) -> Stats:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` timed samples.

    device: a CUDA ``torch.device``/ordinal to time with CUDA events on its current stream, or None
    for the host clock (``sync`` is called inside the timed region, e.g. a device synchronize for
    work that is not on the current stream). ``setup`` runs untimed before every sample (fresh input).
    batch: calls per sample. One event pair around one short call also times the host's launch gap
    before it; around ``batch`` back-to-back calls the queue stays full and the sample is
    elapsed / batch, the per-call time of the work itself (issue 24).
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if batch < 1:
        raise ValueError("batch must be >= 1")
    use_cuda = device is not None and getattr(device, "type", "cuda") == "cuda"
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    if use_cuda or sync:
        (sync or (lambda: _cuda_sync(device)))()
    samples = []
    for _ in range(repeats):
        if setup:
            setup()
        samples.append(_cuda_time_once(fn, device, batch) if use_cuda
                       else _cpu_time_once(fn, sync, batch))
    return summarize(samples)


def _cuda_sync(device) -> None:
    import torch

    torch.cuda.synchronize(device)


class Stopwatch:
    """Host-clock phase timer for breakdowns (``with sw.phase("h2d"): ...``)."""

    def __init__(self, sync: Callable[[], object] | None = None):
        self.sync = sync
        self.phases: dict[str, float] = {}

    def phase(self, name: str):
        sw = self

        class _Phase:
            def __enter__(self):
                if sw.sync:
                    sw.sync()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if sw.sync:
                    sw.sync()
                sw.phases[name] = sw.phases.get(name, 0.0) + time.perf_counter() - self.t0
                return False

        return _Phase()


def abba_order(a: str, b: str, blocks: int) -> list[tuple[str, ...]]:
    """``blocks`` blocks of the sides a, b, b, a: one timed batch each, back to back."""
    return [(a, b, b, a)] * blocks


def block_ratios(time_batch: Callable[[str], float], order: Sequence[tuple[str, ...]],
                 num: str, den: str) -> list[float]:
    """Per block of ``order``, the time of side ``num`` over that of side ``den``.

    ``time_batch(side)`` times one batch of that side and returns its seconds. Comparing each batch
    with its neighbours in time, in ABBA order (:func:`abba_order`), drops a clock that drifts
    between and within blocks (a GPU settling from burst to sustained clocks, ~12 % on the H200:
    shared/notes/h200-measured.md); the median over blocks drops a block hit by a clock step.
    """
    ratios = []
    for block in order:
        t = dict.fromkeys(block, 0.0)
        for side in block:
            t[side] += time_batch(side)
        ratios.append(t[num] / t[den])
    return ratios
