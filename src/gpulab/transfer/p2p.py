"""p2pBandwidthLatencyTest reproduced: P2P matrices (copy engine and SM copy kernel) and a size sweep.

Methodology (as NVIDIA's sample): per sample, a spin kernel holds the issuing stream, a start event
is recorded, ``copies`` copies are queued (``cudaMemcpyPeerAsync`` or the copy kernel), a stop event
is recorded, the host releases the spin flag and waits. Copies are P2P writes: device i's stream
copies i -> j. Bidirectional: device j's second stream waits on the start event and copies j -> i at
the same time. Latency: 16-byte copies; GPU latency from the events, CPU latency from the host clock
around the queueing loop. Added: warm-up samples, ``repeats`` samples with median/min/max, a size
sweep, and every destination is read back and compared with the source bytes.

The P2P=Disabled phase runs in its own process (see :mod:`gpulab.transfer.isolate`) that never
enables peer access; at its end ``cudaDeviceDisablePeerAccess`` must answer "not enabled" for every
pair, which is recorded. The P2P=Enabled phase enables each pair with the raw runtime call before
measuring it and disables it after, as the sample does.
"""
from __future__ import annotations

import time

import pandas as pd

from gpulab.transfer import cudart as cr
from gpulab.transfer.measure import (MAX_QUEUED, bandwidth_row, bytes_moved, copies_for,
                                     latency_row)
from gpulab.transfer.settings import Settings


SPIN_RETRIES = 2


class P2PBench:
    def __init__(self, kits: list[cr.DeviceKit], cfg: Settings, p2p: str):
        self.kits, self.cfg, self.p2p = kits, cfg, p2p
        self.flag = cr.Flag()
        self.scratch = cr.PinnedHost(kits[0].nbytes)
        self.spin_timeouts = 0  # invalid samples of the last measurement

    # -- one copy, one sample -------------------------------------------------------------------
    def _copy(self, mech: str, dst: int, dst_dev: int, src: int, src_dev: int, n: int, stream):
        if mech == "ce":
            with cr.on(src_dev):
                cr.rt().memcpyPeerAsync(dst, dst_dev, src, src_dev, n, stream.ptr)
        else:
            self.kits[src_dev].sm_copy(dst, src, n, stream)

    def _sample(self, i: int, issue, others=()) -> tuple[float, float, bool]:
        """(GPU seconds between the events, host seconds queueing, spin kernel timed out)."""
        k = self.kits[i]
        s0 = k.streams[0]
        start, stop = k.event(), k.event()
        self.flag.arm()
        k.spin(self.flag, s0)
        with cr.on(i):
            start.record(s0)
        for dev, s in others:  # streams joining the sample start with it ...
            with cr.on(dev):
                s.wait_event(start)
        t0 = time.perf_counter()
        issue()
        cpu = time.perf_counter() - t0
        for dev, s in others:  # ... and the sample ends when they are done too
            done = self.kits[dev].event(timing=False)
            with cr.on(dev):
                done.record(s)
            with cr.on(i):
                s0.wait_event(done)
        with cr.on(i):
            stop.record(s0)
        self.flag.set(1)
        stop.synchronize()
        return cupy_elapsed(start, stop), cpu, self.flag.timed_out

    def _samples(self, i, issue, others=()):
        """GPU and host seconds of the timed samples, and how many samples stayed invalid.

        A sample whose spin kernel timed out timed the host's queueing, not the copies: it is
        taken again (up to SPIN_RETRIES times); one still invalid after that is dropped and counted.
        """
        n_warm, n_rep = self.cfg.warmup, self.cfg.repeats
        for _ in range(n_warm):
            self._sample(i, issue, others)
        gpu, cpu, invalid = [], [], 0
        for _ in range(n_rep):
            for _attempt in range(1 + SPIN_RETRIES):
                g, c, timed_out = self._sample(i, issue, others)
                if not timed_out:
                    gpu.append(g)
                    cpu.append(c)
                    break
            else:
                invalid += 1
        self.spin_timeouts = invalid
        if not gpu:  # every sample timed out: keep the row, the check fails on it
            return [float("nan")], [float("nan")]
        return gpu, cpu

    def _clear(self, dev: int, ptr: int, n: int):
        with cr.on(dev):
            cr.rt().memset(ptr, 0, n)
            cr.rt().deviceSynchronize()

    # -- the three tests ------------------------------------------------------------------------
    def _one_way(self, mech, i, j, n, copies):
        """Samples of i -> j copies: (GPU seconds, host queueing seconds, destination verified)."""
        ki, kj = self.kits[i], self.kits[j]
        self._clear(j, kj.dst, n)

        def issue():
            for _ in range(copies):
                self._copy(mech, kj.dst, j, ki.src, i, n, ki.streams[0])

        gpu, cpu = self._samples(i, issue)
        return gpu, cpu, cr.readback_equal(kj.dst, ki.src_host[:n], self.scratch)

    def _hygiene(self, i: int, j: int, n: int) -> dict:
        """Per-row validity: samples lost to spin timeouts, and whether the data sat in L2."""
        return {"spin_timeouts": self.spin_timeouts,
                "cache_resident": cache_resident(n, i == j, self.kits[i].l2_bytes)}

    def uni(self, mech, i, j, n, copies, **keys) -> dict:
        copies = queued(copies)
        gpu, _, ok = self._one_way(mech, i, j, n, copies)
        return bandwidth_row(gpu, bytes_moved(n, copies, same_device=i == j), test="uni",
                             metric="bandwidth", mechanism=mech, p2p=self.p2p, src=i, dst=j, bytes=n,
                             copies=copies, verified=ok, clock="cuda events",
                             **self._hygiene(i, j, n), **keys)

    def bi(self, mech, i, j, n, copies, **keys) -> dict:
        copies = queued(copies)  # per stream: both directions queue this many
        ki, kj = self.kits[i], self.kits[j]
        back_dst = ki.aux if i == j else ki.dst  # same device: the second copy lands in aux
        s_back = kj.streams[1]
        self._clear(j, kj.dst, n)
        self._clear(i, back_dst, n)

        def issue():
            for _ in range(copies):
                self._copy(mech, kj.dst, j, ki.src, i, n, ki.streams[0])
                self._copy(mech, back_dst, i, kj.src, j, n, s_back)

        gpu, _ = self._samples(i, issue, others=[(j, s_back)])
        ok = (cr.readback_equal(kj.dst, ki.src_host[:n], self.scratch)
              and cr.readback_equal(back_dst, kj.src_host[:n], self.scratch))
        return bandwidth_row(gpu, bytes_moved(n, copies, same_device=i == j, bidirectional=True),
                             test="bi", metric="bandwidth", mechanism=mech, p2p=self.p2p, src=i,
                             dst=j, bytes=n, copies=copies, verified=ok, clock="cuda events",
                             **self._hygiene(i, j, n), **keys)

    def latency(self, mech, i, j, **keys) -> list[dict]:
        n, copies = self.cfg.latency_bytes, queued(self.cfg.latency_copies)
        gpu, cpu, ok = self._one_way(mech, i, j, n, copies)
        common = dict(test="latency", mechanism=mech, p2p=self.p2p, src=i, dst=j, bytes=n,
                      verified=ok, spin_timeouts=self.spin_timeouts, **keys)
        return [latency_row(gpu, copies, metric="latency_gpu", clock="cuda events", **common),
                latency_row(cpu, copies, metric="latency_cpu", clock="host perf_counter (queueing)",
                            **common)]

    def close(self):
        self.flag.mem.free()
        self.scratch.free()


def queued(copies: int) -> int:
    """Copies per stream in one sample, capped at MAX_QUEUED (see :mod:`gpulab.transfer.measure`)."""
    return max(1, min(int(copies), MAX_QUEUED))


def cache_resident(nbytes: int, same_device: bool, l2_bytes: int) -> bool:
    """Whether a copy's working set on the issuing device fits in its L2 cache.

    A same-device copy keeps source and destination there (2 x bytes); a peer copy only its source.
    Such sizes measure the cache, not memory bandwidth. Unknown L2 size (0): not marked.
    """
    return bool(l2_bytes) and (2 if same_device else 1) * int(nbytes) <= int(l2_bytes)


def cupy_elapsed(start, stop) -> float:
    return cr.cupy().cuda.get_elapsed_time(start, stop) / 1e3


def _mechanisms(i: int, j: int, peer_on: bool) -> list[str]:
    # A kernel can only address a peer's memory with peer access on; same-device SM copies always work.
    return ["ce", "sm"] if (i == j or peer_on) else ["ce"]


def measure_all(bench: P2PBench, can: list[list[bool]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All matrix cells and the size sweep (pairs 0->0 and 0->1) for this phase's P2P mode."""
    cfg, n_dev = bench.cfg, len(bench.kits)
    nbytes, copies = cfg.matrix_bytes, cfg.copies
    rows, sweep = [], []
    sweep_pairs = {(0, 0), (0, 1)}
    for i in range(n_dev):
        for j in range(n_dev):
            peer_on = False
            if bench.p2p == "enabled" and i != j and can[i][j] and can[j][i]:
                cr.set_peer_access(i, j, True)
                cr.set_peer_access(j, i, True)
                peer_on = True
            keys = dict(peer_access=peer_on)
            for mech in _mechanisms(i, j, peer_on):
                rows.append(bench.uni(mech, i, j, nbytes, copies, **keys))
                rows.append(bench.bi(mech, i, j, nbytes, copies, **keys))
                rows.extend(bench.latency(mech, i, j, **keys))
                if (i, j) in sweep_pairs:
                    for size in cfg.p2p_sizes:
                        c = copies_for(size, copies, cfg.sweep_target_bytes)
                        sweep.append(bench.uni(mech, i, j, int(size), c, **keys))
            if peer_on:  # the sample disables each pair again after measuring it
                cr.set_peer_access(i, j, False)
                cr.set_peer_access(j, i, False)
    return pd.DataFrame(rows), pd.DataFrame(sweep)
