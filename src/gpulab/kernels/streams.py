"""One stream/event interface over CUDA streams and CPU virtual devices.

The split experiment enqueues the same program (copy in, kernel, copy out, events between) on every
device. On CUDA a stream is a ``torch.cuda.Stream`` and work is enqueued asynchronously by the host
thread. On a CPU virtual device a stream is a worker thread that runs the queued work in order, so
enqueueing is just as asynchronous and two streams of one device really overlap (the CPU analogue
of a copy engine beside the SMs). Events carry timestamps in both cases.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from gpulab.devices import Device


class CpuEvent:
    def __init__(self):
        self._done = threading.Event()
        self.t = float("nan")

    def _fire(self) -> None:
        self.t = time.perf_counter()
        self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def seconds_until(self, later: "CpuEvent") -> float:
        return later.t - self.t


class CpuStream:
    """In-order queue of work on one worker thread."""

    def __init__(self, device: Device):
        self.device = device
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"{device.label}-stream")
        self._last: Future | None = None

    def submit(self, fn: Callable[[], object]) -> None:
        self._last = self._pool.submit(fn)

    def record(self) -> CpuEvent:
        ev = CpuEvent()
        self.submit(ev._fire)
        return ev

    def wait_event(self, ev: CpuEvent) -> None:
        self.submit(ev.wait)

    def synchronize(self) -> None:
        if self._last is not None:
            self._last.result()  # re-raises an exception from the queued work

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class CudaEvent:
    def __init__(self, stream):
        import torch

        self.ev = torch.cuda.Event(enable_timing=True)
        self.ev.record(stream)

    def seconds_until(self, later: "CudaEvent") -> float:
        return self.ev.elapsed_time(later.ev) / 1e3


class CudaStream:
    """A torch CUDA stream; ``submit`` enqueues from the calling host thread."""

    def __init__(self, device: Device):
        import torch

        self.device = device
        self.stream = torch.cuda.Stream(device=device.torch_device)

    def submit(self, fn: Callable[[], object]) -> None:
        import torch

        with torch.cuda.device(self.device.index), torch.cuda.stream(self.stream):
            fn()

    def record(self) -> CudaEvent:
        import torch

        with torch.cuda.device(self.device.index):
            return CudaEvent(self.stream)

    def wait_event(self, ev: CudaEvent) -> None:
        self.stream.wait_event(ev.ev)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        pass


def new_stream(device: Device):
    return CudaStream(device) if device.kind == "cuda" else CpuStream(device)
