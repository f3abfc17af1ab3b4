"""Transfer and interconnect benchmarks: the p2pBandwidthLatencyTest matrices and beyond.

On GPU hosts three isolated processes measure: P2P=Disabled (never enables peer access),
P2P=Enabled (+ torch reference, hybrid split, cudaMalloc with peers) and host <-> device. On every
host the host-memory copies run too; on CPU hosts the matrices are measured between CPU virtual
devices (threads' buffers). GPU-only measurements are listed as not applicable, never left out.
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from gpulab import outcomes, phases, results, seedref
from gpulab.transfer import bars, energy, hostmem, malloc, matrices
from gpulab.transfer.measure import CONVENTIONS, MAX_QUEUED
from gpulab.transfer.settings import Settings

log = logging.getLogger("gpulab.transfer")
STAGE = "transfer"


# The value columns of the transfer rows hold bandwidths and latencies, each row's in its 'unit'.
NOTES = {"value": "GB/s for bandwidth, us for latency"}


def _add(result, name: str, df: pd.DataFrame):
    if df is not None and len(df):
        result.add_table(name, df, units=outcomes.units_for(df, NOTES))


def _host_memory(result, cfg: Settings):
    w, rep, c, seed = cfg.warmup, cfg.repeats, cfg.copies, cfg.seed
    _add(result, "host_memcpy", hostmem.memcpy_sweep(cfg.host_sizes, w, rep, c,
                                                     cfg.sweep_target_bytes, seed))
    _add(result, "host_threads", hostmem.thread_scaling(cfg.host_threads, cfg.host_threads_bytes,
                                                        w, rep, c, seed))


def _add_matrices(result, rows: pd.DataFrame, n: int, label: str):
    for name, (m, meta) in matrices.build(rows, n, label).items():
        result.add_matrix(name, m, **meta)


def _gpu(result, cfg: Settings, n: int) -> tuple[int, list, list]:
    """The GPU phases; returns (peer pairs, bars, checks)."""
    from gpulab.transfer import gpu
    from gpulab.transfer.isolate import run_isolated

    log.info("transfer: P2P=Disabled phase (own process, peer access never enabled)")
    dis = run_isolated(gpu.disabled_phase, cfg)
    log.info("transfer: P2P=Enabled phase")
    ena = run_isolated(gpu.enabled_phase, cfg)
    log.info("transfer: host <-> device phase")
    hst = run_isolated(gpu.host_phase, cfg)
    p2p_rows = pd.concat([dis["p2p"], ena["p2p"]], ignore_index=True)
    _add(result, "p2p", p2p_rows)
    _add(result, "p2p_sweep", pd.concat([dis["sweep"], ena["sweep"]], ignore_index=True))
    _add_matrices(result, p2p_rows, n, "GPU")
    labels = [f"GPU{i}" for i in range(n)]
    result.add_matrix("connectivity", np.array(dis["connectivity"], dtype=np.int8), "bool", rows=labels,
                      cols=labels, title="P2P Connectivity Matrix (cudaDeviceCanAccessPeer; 1 on the diagonal)")
    _add(result, "torch_d2d", ena["torch_d2d"])
    _add(result, "hybrid", ena.get("hybrid"))
    _add(result, "malloc", pd.concat([dis["malloc"], ena.get("malloc")], ignore_index=True))
    _add(result, "host_device", hst["host_device"])
    _add(result, "host_device_threads", hst["host_device_threads"])
    _add(result, "host_device_links", hst.get("host_device_links"))
    names, links = dis["gpu_names"], hst["links"]
    _add(result, "links", pd.DataFrame([
        {"gpu": i, **{k: v for k, v in ln.items() if k != "nvlinks_to"},
         "nvlinks_to": ",".join(f"GPU{j}:{c}" for j, c in sorted(ln.get("nvlinks_to", {}).items()))}
        for i, ln in enumerate(links)]))
    bar_rows = bars.gpu_bars(p2p_rows, names, links, hst["h2d_bar"], hst["host_device"],
                             hst.get("host_device_links"))
    tables = {"p2p": p2p_rows, "p2p_sweep": result.tables.get("p2p_sweep"),
              "torch_d2d": ena["torch_d2d"], "hybrid": ena.get("hybrid"),
              "host_device": hst["host_device"], "host_device_threads": hst["host_device_threads"],
              "host_device_links": hst.get("host_device_links")}
    check_rows = (bars.harness_checks(p2p_rows, ena["torch_d2d"], hst["h2d_bar"])
                  + bars.spread_checks(p2p_rows, hst["h2d_bar"])
                  + bars.spin_checks(tables) + bars.copy_checks(tables)
                  + bars.plausibility_checks(pd.concat([p2p_rows, result.tables.get(
                      "p2p_sweep", pd.DataFrame())], ignore_index=True), names, links, [
                      hst["host_device"], hst.get("host_device_links"),
                      pd.DataFrame([hst["h2d_bar"]["mine"]])], hybrid=ena.get("hybrid"),
                      threads=hst["host_device_threads"])
                  + [bars.isolation_check(n, dis["isolation_pairs"], dis["isolation_ok"],
                                          dis["isolation_check"])])
    peer_pairs = int(np.sum(np.array(dis["connectivity"])) - n)
    result.attrs.update({"isolation_check": dis["isolation_check"], "gpu_names": names,
                         "l2_bytes": dis["l2_bytes"], "peer_pairs": peer_pairs,
                         "max_queued_per_stream": MAX_QUEUED})
    return peer_pairs, bar_rows, check_rows


def _cpu(result, cfg: Settings, n: int) -> tuple[int, list, list]:
    vd = hostmem.VirtualDevices(n, cfg.matrix_bytes, cfg.seed)
    rows = vd.matrices(cfg.warmup, cfg.repeats, cfg.copies, cfg.latency_bytes,
                       cfg.latency_copies)
    _add(result, "p2p", rows)
    _add_matrices(result, rows, n, "CPU")
    result.attrs["isolation_check"] = "not applicable: CPU virtual devices (no peer access to toggle)"
    return 0, bars.cpu_bars(), bars.copy_checks({"p2p": rows})


def run(ctx):
    cfg = ctx.settings
    devices = ctx.devices()
    kind, n = devices[0].kind, len(devices)
    result = ctx.new_result(kind, conventions=CONVENTIONS, device_count=n,
                            device_names=[d.name for d in devices])
    log.info("transfer: %d %s device(s)", n, kind)
    with phases.phase("host memory copies"):
        _host_memory(result, cfg)
    if kind == "cuda":  # its isolated processes record their own phases
        peer_pairs, bar_rows, check_rows = _gpu(result, cfg, n)
    else:
        with phases.phase("CPU virtual-device matrices"):
            peer_pairs, bar_rows, check_rows = _cpu(result, cfg, n)
    with phases.phase("energy of the same-device copy"):
        energy.add_table(result, cfg, kind)
    check_rows += bars.copy_checks({k: result.tables.get(k) for k in ("host_memcpy", "host_threads")})
    result.add_table(outcomes.BARS, outcomes.bars_frame(bar_rows))
    checks = outcomes.checks_frame(check_rows)
    result.add_table(outcomes.CHECKS, checks)
    result.add_table(outcomes.NOT_APPLICABLE,
                     outcomes.not_applicable_frame(bars.not_applicable(kind, n, peer_pairs)))
    for name, m in seedref.seed_reference().items():
        labels = [f"GPU{i}" for i in range(len(m))]
        result.add_matrix(f"ref_a5000_{name}", m, "GB/s" if name.endswith("GBps") else "us", rows=labels,
                          cols=labels, source=seedref.SEED_SOURCE)
    failed = checks[checks.verdict == outcomes.Verdict.FAIL.value]
    for row in failed.itertuples():
        log.error("transfer: check failed: %s [%s] %s", row.check, row.case, row.note)
    return result
