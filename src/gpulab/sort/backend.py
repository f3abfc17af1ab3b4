"""Array backends: the sorting algorithms are written once against this interface.

``NumpyBackend`` drives CPU virtual devices (every device's memory is its own numpy array, so a
"peer copy" is a real memory copy); ``CupyBackend`` drives CUDA devices with CuPy arrays and
peer-to-peer copies (``cudaMemcpyPeerAsync``). Array math inside the algorithms goes through
``backend.xp`` (numpy or cupy), always under ``with backend.on(d)``, so the same code runs on both.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

from gpulab import timing


class NumpyBackend:
    """CPU virtual devices: device ``d`` is a label; its arrays are ordinary numpy arrays."""

    name = "numpy"

    def __init__(self, n_devices: int):
        if n_devices < 1:
            raise ValueError(f"a backend needs at least one device, got {n_devices}")
        self.n = n_devices
        self.xp = np
        # One thread per device: numpy releases the GIL in sort/searchsorted, so virtual devices
        # really work concurrently (and on CUDA, one host thread per device keeps all GPUs busy).
        self._pool = ThreadPoolExecutor(max_workers=n_devices) if n_devices > 1 else None

    # -- placement -------------------------------------------------------------------------
    def on(self, d: int):
        return contextlib.nullcontext()

    def run(self, fn: Callable[[int], Any], devices: Sequence[int] | None = None) -> list:
        """``fn(d)`` under ``on(d)`` for every device d (default all), concurrently; in order."""
        devices = list(range(self.n)) if devices is None else list(devices)

        def call(d):
            with self.on(d):
                return fn(d)

        if self._pool is None or len(devices) <= 1:
            return [call(d) for d in devices]
        return list(self._pool.map(call, devices))

    def sync(self) -> None:
        """Wait for all queued work on every device (nothing is asynchronous on CPU)."""

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    # -- memory ----------------------------------------------------------------------------
    def empty(self, d: int, n: int, dtype) -> Any:
        return np.empty(n, dtype=dtype)

    def pinned_copy(self, host: np.ndarray) -> np.ndarray:
        """Host staging copy the transfers read from (pinned on CUDA); no copy needed on CPU."""
        return host

    def host_empty(self, n: int, dtype) -> np.ndarray:
        return np.empty(n, dtype=dtype)

    def to_device(self, d: int, host: np.ndarray) -> Any:
        return np.array(host, copy=True)

    def to_host(self, d: int, arr: Any, out: np.ndarray) -> None:
        np.copyto(out, arr)

    def copy_into(self, dst_d: int, dst, dst_off: int, src_d: int, src, start: int, stop: int):
        """dst[dst_off : dst_off + (stop-start)] = src[start:stop] (peer copy when src_d != dst_d)."""
        dst[dst_off:dst_off + stop - start] = src[start:stop]

    def item(self, d: int, arr, i: int):
        return arr[i]

    def asnumpy(self, arr) -> np.ndarray:
        return np.asarray(arr)

    # -- compute ---------------------------------------------------------------------------
    def sort(self, d: int, arr):
        return np.sort(arr)

    def argsort_small(self, d: int, arr):
        """Permutation grouping small integer labels (stable radix sort on uint8 in numpy)."""
        return np.argsort(arr, kind="stable")

    def time_device(self, fn: Callable[[], object], d: int, warmup: int, repeats: int,
                    batch: int = 1):
        """Per-call times of fn, ``batch`` back-to-back calls per sample (see timing.measure)."""
        return timing.measure(fn, warmup=warmup, repeats=repeats, batch=batch)

    def free(self) -> None:
        """Give cached device memory back (between large cases)."""


class CupyBackend(NumpyBackend):
    """CUDA devices of this process, driven with CuPy.

    Logical device d is CUDA device ``device_ids[d]`` (default d). Several logical devices may
    share one GPU (``device_ids=[0, 0, 0]``): the algorithms then run their multi-device CUDA code
    paths on a one-GPU host, for correctness checks only (their "peer" copies stay on the GPU).
    """

    name = "cupy"

    def __init__(self, n_devices: int, device_ids: Sequence[int] | None = None):
        import cupy as cp

        super().__init__(n_devices)
        self.ids = list(range(n_devices)) if device_ids is None else [int(i) for i in device_ids]
        if len(self.ids) != n_devices:
            raise ValueError(f"{n_devices} logical devices but {len(self.ids)} device ids")
        visible = cp.cuda.runtime.getDeviceCount()
        if max(self.ids) >= visible:
            raise RuntimeError(f"CUDA device {max(self.ids)} requested, {visible} visible")
        self.cp = cp
        self.xp = cp
        self.peer = np.zeros((n_devices, n_devices), dtype=bool)
        for i, pi in enumerate(self.ids):
            for j, pj in enumerate(self.ids):
                if pi != pj and cp.cuda.runtime.deviceCanAccessPeer(pi, pj):
                    with cp.cuda.Device(pi):
                        try:
                            cp.cuda.runtime.deviceEnablePeerAccess(pj)
                        except cp.cuda.runtime.CUDARuntimeError:
                            pass  # already enabled in this process
                    self.peer[i, j] = True

    @property
    def shared(self) -> bool:
        """True when logical devices share a GPU (correctness runs, never timed)."""
        return len(set(self.ids)) < len(self.ids)

    def on(self, d: int):
        return self.cp.cuda.Device(self.ids[d])

    def sync(self) -> None:
        for i in sorted(set(self.ids)):
            self.cp.cuda.Device(i).synchronize()

    def empty(self, d: int, n: int, dtype):
        with self.on(d):
            return self.cp.empty(n, dtype=dtype)

    def pinned_copy(self, host: np.ndarray) -> np.ndarray:
        out = self.host_empty(host.size, host.dtype)
        np.copyto(out, host)
        return out

    def host_empty(self, n: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        mem = self.cp.cuda.alloc_pinned_memory(max(1, n * dtype.itemsize))
        return np.frombuffer(mem, dtype=dtype, count=n)

    def to_device(self, d: int, host: np.ndarray):
        with self.on(d):
            a = self.cp.empty(host.size, dtype=host.dtype)
            a.set(host)
            return a

    def to_host(self, d: int, arr, out: np.ndarray) -> None:
        with self.on(d):
            arr.get(out=out)

    def copy_into(self, dst_d: int, dst, dst_off: int, src_d: int, src, start: int, stop: int):
        n = stop - start
        if n <= 0:
            return
        size = src.dtype.itemsize
        with self.on(dst_d):
            stream = self.cp.cuda.get_current_stream().ptr
            dst_ptr = dst.data.ptr + dst_off * size
            src_ptr = src.data.ptr + start * size
            if self.ids[src_d] == self.ids[dst_d]:
                self.cp.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, n * size,
                                                 self.cp.cuda.runtime.memcpyDeviceToDevice, stream)
            else:
                self.cp.cuda.runtime.memcpyPeerAsync(dst_ptr, self.ids[dst_d], src_ptr,
                                                     self.ids[src_d], n * size, stream)

    def item(self, d: int, arr, i: int):
        with self.on(d):
            return arr[i].get()[()]

    def asnumpy(self, arr) -> np.ndarray:
        return self.cp.asnumpy(arr)

    def sort(self, d: int, arr):
        with self.on(d):
            return self.cp.sort(arr)  # CUB radix sort, keys only

    def argsort_small(self, d: int, arr):
        with self.on(d):
            return self.cp.argsort(arr)  # radix sort over the 8 bits of a uint8 label

    def time_device(self, fn, d: int, warmup: int, repeats: int, batch: int = 1):
        """CUDA events on device d's current stream around ``batch`` back-to-back calls of fn
        (which must queue its work there); each sample is the per-call time, elapsed / batch."""
        cp = self.cp
        with self.on(d):
            for _ in range(warmup):
                fn()
            cp.cuda.Device(self.ids[d]).synchronize()
            samples = []
            for _ in range(repeats):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for _ in range(batch):
                    fn()
                end.record()
                end.synchronize()
                samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3 / batch)
        return timing.summarize(samples)

    def free(self) -> None:
        self.sync()
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()


def make_backend(kind: str, n_devices: int, device_ids: Sequence[int] | None = None) -> NumpyBackend:
    """The backend for a device kind ('cuda' or 'cpu') with n devices (see CupyBackend)."""
    if kind == "cuda":
        return CupyBackend(n_devices, device_ids)
    if kind == "cpu":
        return NumpyBackend(n_devices)
    raise ValueError(f"unknown device kind {kind!r} (expected 'cuda' or 'cpu')")
