"""The GPU phases, each run in a fresh process by :func:`gpulab.transfer.isolate.run_isolated`.

- ``disabled_phase``: P2P=Disabled matrices and sweep, cudaMalloc cost without peer access, and the
  proof that peer access stayed off. No torch import, no CuPy array ever created here.
- ``enabled_phase``: P2P=Enabled matrices and sweep, torch's same-device copy (bar reference), the
  hybrid split transfer, cudaMalloc cost with every peer enabled.
- ``host_phase``: host <-> device sweep, the host-thread test, torch's pinned H2D (bar reference).
Each returns plain data (DataFrames and dicts) to the parent.
"""
from __future__ import annotations

import pandas as pd

from gpulab import devices
from gpulab.transfer import cudart as cr
from gpulab.transfer import hostdev, hybrid, malloc, p2p
from gpulab.transfer.settings import Settings


def _kits(cfg: Settings, nbytes: int) -> list[cr.DeviceKit]:
    n = cr.rt().getDeviceCount()
    return [cr.DeviceKit(d, nbytes, cfg.seed, cfg.spin_timeout_clocks) for d in range(n)]


def _p2p_bytes(cfg: Settings) -> int:
    return max([cfg.matrix_bytes, cfg.latency_bytes] + list(cfg.p2p_sizes))


def _connectivity(n: int) -> list[list[bool]]:
    return [[i == j or cr.can_access_peer(i, j) for j in range(n)] for i in range(n)]


def _malloc(cfg: Settings, peers: int, label: str) -> pd.DataFrame:
    return malloc.malloc_cost(0, cfg.malloc_count, cfg.malloc_bytes, cfg.warmup,
                              max(1, cfg.repeats // 2), peers, label)


def disabled_phase(cfg: Settings) -> dict:
    kits = _kits(cfg, _p2p_bytes(cfg))
    n = len(kits)
    can = _connectivity(n)
    bench = p2p.P2PBench(kits, cfg, "disabled")
    try:
        rows, sweep = p2p.measure_all(bench, can)
        mal = _malloc(cfg, 0, "without")
        # Proof of isolation: every pair that could have peer access must still report it off.
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j and can[i][j]]
        leaked = [f"{i}->{j}" for i, j in pairs if not cr.peer_access_is_off(i, j)]
    finally:
        bench.close()
        for k in kits:
            k.free()
    check = ("n/a: a single GPU has no peer" if not pairs else
             "peer access stayed off: cudaDeviceDisablePeerAccess answered cudaErrorPeerAccessNotEnabled "
             f"for all {len(pairs)} pairs" if not leaked else f"CONTAMINATED: peer access was on for {leaked}")
    return {"p2p": rows, "sweep": sweep, "malloc": mal, "connectivity": can, "isolation_check": check,
            "isolation_ok": not leaked, "isolation_pairs": len(pairs), "gpu_names": [k.name for k in kits],
            "l2_bytes": [k.l2_bytes for k in kits]}


def enabled_phase(cfg: Settings) -> dict:
    nbytes = max(_p2p_bytes(cfg), cfg.hybrid_bytes)
    kits = _kits(cfg, nbytes)
    n = len(kits)
    can = _connectivity(n)
    bench = p2p.P2PBench(kits, cfg, "enabled")
    out = {"connectivity": can}
    try:
        out["p2p"], out["sweep"] = p2p.measure_all(bench, can)
        out["torch_d2d"] = pd.DataFrame([
            hostdev.torch_d2d(d, cfg.matrix_bytes, cfg.copies, cfg.warmup,
                              cfg.repeats) for d in range(n)])
        if n >= 2:
            both = can[0][1] and can[1][0]
            if both:
                cr.set_peer_access(0, 1, True)
                cr.set_peer_access(1, 0, True)
            out["hybrid"] = hybrid.measure(kits[0], kits[1], cfg)
            out["hybrid"]["peer_access"] = both
        # cudaMalloc with every possible peer mapping on (both directions, all pairs).
        peers = 0
        for i in range(n):
            for j in range(n):
                if i != j and can[i][j]:
                    cr.set_peer_access(i, j, True)
                    peers += i == 0
        if peers:
            out["malloc"] = _malloc(cfg, peers, "with")
        for i in range(n):
            for j in range(n):
                if i != j and can[i][j]:
                    cr.set_peer_access(i, j, False)
    finally:
        bench.close()
        for k in kits:
            k.free()
    return out


def host_phase(cfg: Settings) -> dict:
    nbytes = max(list(cfg.host_sizes) + [cfg.host_threads_bytes])
    kits = _kits(cfg, nbytes)
    try:
        sweep = hostdev.sweep(kits[0], cfg)
        thr = hostdev.threads(kits, cfg)
        bar_n = max(cfg.host_sizes)
        c = cfg.copies
        ref = hostdev.torch_pinned_h2d(0, bar_n, c, cfg.warmup, cfg.repeats, cfg.seed)
        scratch = cr.PinnedHost(bar_n)
        hb = hostdev.HostBuffers(bar_n, cfg.seed + 5)
        try:  # ours at exactly the reference's size and copy count, in the same process
            mine = hostdev.measure_one(kits[0], hb, "H2D", "pinned", "async", bar_n, c, cfg.warmup,
                                cfg.repeats, scratch)
            # Every other GPU's own link, at the same size: a degraded link on GPU3 must show.
            per_gpu = pd.DataFrame([
                hostdev.measure_one(k, hb, direction, "pinned", "async", bar_n, c,
                                    cfg.warmup, cfg.repeats, scratch)
                for k in kits[1:] for direction in ("H2D", "D2H")])
            # Read the links right after the copies: an idle PCIe link trains down to save power.
            links = devices.link_info([k.bus_id for k in kits])
        finally:
            hb.free()
            scratch.free()
    finally:
        for k in kits:
            k.free()
    return {"host_device": sweep, "host_device_threads": thr, "h2d_bar": {"mine": mine, "torch": ref},
            "host_device_links": per_gpu, "links": links}
