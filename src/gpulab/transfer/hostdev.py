"""Host <-> device copies: pinned vs pageable, async (cudaMemcpyAsync) vs blocking (cudaMemcpy),
one host thread for all GPUs vs one thread per GPU; plus torch's pinned ``copy_`` as the reference.

Async samples are timed with CUDA events around ``copies`` queued copies on a non-blocking stream
(no spin kernel here: a pageable D2H cudaMemcpyAsync returns only when done, so a held stream would
stall it). Blocking samples are timed with the host clock around the loop of cudaMemcpy calls.
The multi-GPU thread test is timed with the host clock from the first issue to the last GPU done.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd

from gpulab import timing
from gpulab.transfer import cudart as cr
from gpulab.transfer.measure import bandwidth_row, bound_by, bytes_moved, copies_for, random_bytes
from gpulab.transfer.settings import Settings


class HostBuffers:
    """Pinned and pageable host source (random) and destination buffers of one size."""

    def __init__(self, n: int, seed: int):
        self.pinned_src, self.pinned_dst = cr.PinnedHost(n), cr.PinnedHost(n)
        self.pinned_src.array[:] = random_bytes(n, seed)
        self.pageable_src = random_bytes(n, seed + 7)
        self.pageable_dst = np.zeros(n, np.uint8)

    def ptrs(self, memory: str) -> tuple[int, np.ndarray, int, np.ndarray]:
        if memory == "pinned":
            return self.pinned_src.ptr, self.pinned_src.array, self.pinned_dst.ptr, self.pinned_dst.array
        return (self.pageable_src.ctypes.data, self.pageable_src, self.pageable_dst.ctypes.data,
                self.pageable_dst)

    def free(self):
        self.pinned_src.free()
        self.pinned_dst.free()


def measure_one(kit: cr.DeviceKit, hb: HostBuffers, direction: str, memory: str, call: str, n: int,
         copies: int, warmup: int, repeats: int, scratch: cr.PinnedHost) -> dict:
    r, s = cr.rt(), kit.streams[0]
    hsrc, hsrc_arr, hdst, hdst_arr = hb.ptrs(memory)
    if direction == "H2D":
        dst, src, kind = kit.dst, hsrc, cr.H2D
        with cr.on(kit.index):
            r.memset(kit.dst, 0, n)
            r.deviceSynchronize()
    else:
        dst, src, kind = hdst, kit.src, cr.D2H
        hdst_arr[:n] = 0

    def once() -> float:
        with cr.on(kit.index):
            if call == "blocking":
                t0 = time.perf_counter()
                for _ in range(copies):
                    r.memcpy(dst, src, n, kind)
                return time.perf_counter() - t0
            start, stop = kit.event(), kit.event()
            start.record(s)
            for _ in range(copies):
                r.memcpyAsync(dst, src, n, kind, s.ptr)
            stop.record(s)
            stop.synchronize()
            return cr.cupy().cuda.get_elapsed_time(start, stop) / 1e3

    samples = [once() for _ in range(warmup + repeats)][warmup:]
    if direction == "H2D":
        ok = cr.readback_equal(kit.dst, hsrc_arr[:n], scratch)
    else:
        ok = bool(np.array_equal(hdst_arr[:n], kit.src_host[:n]))
    return bandwidth_row(samples, bytes_moved(n, copies, same_device=False), direction=direction,
                         memory=memory, call=call, device=kit.index, bytes=n, copies=copies,
                         verified=ok, clock="cuda events" if call == "async" else "host perf_counter",
                         bound_by=bound_by(n))


def sweep(kit: cr.DeviceKit, cfg: Settings) -> pd.DataFrame:
    sizes = list(cfg.host_sizes)
    hb, scratch = HostBuffers(max(sizes), cfg.seed), cr.PinnedHost(max(sizes))
    rows = []
    try:
        for n in sizes:
            c = copies_for(n, cfg.copies, cfg.sweep_target_bytes)
            for direction in ("H2D", "D2H"):
                for memory in ("pinned", "pageable"):
                    for call in ("async", "blocking"):
                        rows.append(measure_one(kit, hb, direction, memory, call, n, c, cfg.warmup,
                                         cfg.repeats, scratch))
    finally:
        hb.free()
        scratch.free()
    return pd.DataFrame(rows)


def threads(kits: list[cr.DeviceKit], cfg: Settings) -> pd.DataFrame:
    """Pinned H2D to every GPU at once: one host thread issuing for all vs one thread per GPU."""
    n, copies = cfg.host_threads_bytes, cfg.copies
    bufs = [cr.PinnedHost(n) for _ in kits]
    for k, b in enumerate(bufs):
        b.array[:] = random_bytes(n, cfg.seed + 100 + k)
    r = cr.rt()

    def issue(kit, buf, call):
        with cr.on(kit.index):
            for _ in range(copies):
                if call == "blocking":
                    r.memcpy(kit.dst, buf.ptr, n, cr.H2D)
                else:
                    r.memcpyAsync(kit.dst, buf.ptr, n, cr.H2D, kit.streams[0].ptr)

    def wait(kit):
        kit.streams[0].synchronize()

    def one_thread(call) -> float:
        t0 = time.perf_counter()
        for kit, buf in zip(kits, bufs):
            issue(kit, buf, call)
        for kit in kits:
            wait(kit)
        return time.perf_counter() - t0

    def per_gpu(call) -> float:
        barrier, spans = threading.Barrier(len(kits)), [None] * len(kits)

        def work(idx):
            barrier.wait()
            t0 = time.perf_counter()
            issue(kits[idx], bufs[idx], call)
            wait(kits[idx])
            spans[idx] = (t0, time.perf_counter())

        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(kits))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return max(e for _, e in spans) - min(s for s, _ in spans)

    rows = []
    scratch = cr.PinnedHost(n)
    try:
        for threading_mode, fn in (("one thread for all GPUs", one_thread), ("one thread per GPU", per_gpu)):
            for call in ("async", "blocking"):
                s = [fn(call) for _ in range(cfg.warmup + cfg.repeats)][cfg.warmup:]
                ok = all(cr.readback_equal(k.dst, b.array, scratch) for k, b in zip(kits, bufs))
                rows.append(bandwidth_row(s, len(kits) * bytes_moved(n, copies, same_device=False),
                                          threading=threading_mode, call=call, direction="H2D",
                                          memory="pinned", gpus=len(kits), bytes=n, copies=copies,
                                          verified=ok, clock="host perf_counter"))
    finally:
        for b in bufs + [scratch]:
            b.free()
    return pd.DataFrame(rows)


def torch_pinned_h2d(device: int, n: int, copies: int, warmup: int, repeats: int, seed: int) -> dict:
    """Reference for the bar: torch's pinned ``copy_(non_blocking=True)`` at the same size."""
    import torch

    dev = torch.device("cuda", device)
    h = torch.from_numpy(random_bytes(n, seed + 3)).pin_memory()
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    st = timing.measure(lambda: [d.copy_(h, non_blocking=True) for _ in range(copies)],
                        warmup=warmup, repeats=repeats, device=dev)
    ok = bool(torch.equal(d.cpu(), h))
    return bandwidth_row(st.samples, bytes_moved(n, copies, same_device=False), what="torch pinned H2D",
                         device=device, bytes=n, copies=copies, verified=ok, clock="cuda events")


def torch_d2d(device: int, n: int, copies: int, warmup: int, repeats: int) -> dict:
    """Reference for the bar: a plain torch same-device ``copy_`` (read+write counted)."""
    import torch

    dev = torch.device("cuda", device)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    st = timing.measure(lambda: [dst.copy_(src) for _ in range(copies)], warmup=warmup,
                        repeats=repeats, device=dev)
    return bandwidth_row(st.samples, bytes_moved(n, copies, same_device=True), what="torch D2D copy_",
                         device=device, bytes=n, copies=copies, verified=bool(torch.equal(dst, src)),
                         clock="cuda events")
