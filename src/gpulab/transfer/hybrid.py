"""Hybrid split transfer (seed, chapter 4): GPU0 -> GPU1 over the direct P2P path and through host
memory at once, split in the ratio of their measured bandwidths R = BW_p2p / BW_host: R/(1+R) of
the bytes go peer-to-peer, 1/(1+R) through pinned host memory.

The host path is pipelined in chunks: D2H of chunk k on GPU0's stream, then GPU1's stream waits for
it and copies it H2D, so both PCIe directions work at once. Each variant is timed with the host
clock from the first enqueue to the end of every stream (it spans two devices).
"""
from __future__ import annotations

import time

import pandas as pd

from gpulab.transfer import cudart as cr
from gpulab.transfer.measure import bandwidth_row
from gpulab.transfer.settings import Settings

ALIGN = 4096


class Hybrid:
    def __init__(self, k0: cr.DeviceKit, k1: cr.DeviceKit, nbytes: int, chunk: int):
        self.k0, self.k1, self.n, self.chunk = k0, k1, nbytes, chunk
        self.stage = cr.PinnedHost(nbytes)
        self.scratch = cr.PinnedHost(nbytes)
        cp = cr.cupy()
        with cr.on(k0.index):
            self.s_p2p, self.s_d2h = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
        with cr.on(k1.index):
            self.s_h2d = cp.cuda.Stream(non_blocking=True)

    def _issue(self, p2p_bytes: int):
        k0, k1, r = self.k0, self.k1, cr.rt()
        if p2p_bytes:
            with cr.on(k0.index):
                r.memcpyPeerAsync(k1.dst, k1.index, k0.src, k0.index, p2p_bytes, self.s_p2p.ptr)
        for off in range(p2p_bytes, self.n, self.chunk):
            m = min(self.chunk, self.n - off)
            with cr.on(k0.index):
                r.memcpyAsync(self.stage.ptr + off, k0.src + off, m, cr.D2H, self.s_d2h.ptr)
                ev = cr.cupy().cuda.Event(disable_timing=True)
                ev.record(self.s_d2h)
            with cr.on(k1.index):
                self.s_h2d.wait_event(ev)
                r.memcpyAsync(k1.dst + off, self.stage.ptr + off, m, cr.H2D, self.s_h2d.ptr)

    def _once(self, p2p_bytes: int) -> float:
        t0 = time.perf_counter()
        self._issue(p2p_bytes)
        for s in (self.s_p2p, self.s_d2h, self.s_h2d):
            s.synchronize()
        return time.perf_counter() - t0

    def run(self, path: str, p2p_bytes: int, warmup: int, repeats: int, r_ratio: float) -> dict:
        with cr.on(self.k1.index):
            cr.rt().memset(self.k1.dst, 0, self.n)
            cr.rt().deviceSynchronize()
        s = [self._once(p2p_bytes) for _ in range(warmup + repeats)][warmup:]
        ok = cr.readback_equal(self.k1.dst, self.k0.src_host[: self.n], self.scratch)
        return bandwidth_row(s, self.n, path=path, src=self.k0.index, dst=self.k1.index, bytes=self.n,
                             p2p_bytes=p2p_bytes, host_bytes=self.n - p2p_bytes, ratio_R=r_ratio,
                             verified=ok, clock="host perf_counter")

    def close(self):
        self.stage.free()
        self.scratch.free()


def split_bytes(n: int, r: float) -> int:
    """Bytes for the P2P path: n * R / (1 + R), rounded to whole pages."""
    return int(round(n * r / (1 + r) / ALIGN)) * ALIGN


def measure(k0, k1, cfg: Settings) -> pd.DataFrame:
    n, w, rep = cfg.hybrid_bytes, cfg.warmup, cfg.repeats
    h = Hybrid(k0, k1, n, cfg.hybrid_chunk_bytes)
    try:
        p2p = h.run("p2p only", n, w, rep, float("nan"))
        host = h.run("host only", 0, w, rep, float("nan"))
        r = p2p["value_median"] / host["value_median"]
        rows = [p2p, host, h.run("split R/(1+R)", split_bytes(n, r), w, rep, r)]
    finally:
        h.close()
    best = max(p2p["value_median"], host["value_median"])
    for row in rows:
        row["ratio_R"] = r
        row["speedup_vs_best_single"] = row["value_median"] / best
    return pd.DataFrame(rows)
