"""Node state before a run, like DCGM's pre-run checks: is this GPU fit to be measured now?

Per GPU, from NVML (each field only where NVML answers; the probe records what it could not):

- other compute processes on the GPU (NVML's running compute processes, minus gpulab's own: this
  process, its ancestors, and every process of the same Snakemake run, found by the
  ``GPULAB_OWNER_PID`` that run sets in its jobs' environment). Another tenant on a GPU under test
  takes clocks, power, memory bandwidth and SMs from the measurement, or keeps clocks up that an
  idle GPU would lower: either way the numbers of this run are not trustworthy, a failed check
  naming each process;
- utilisation and memory in use (recorded: gpulab's own jobs may already be running beside the
  probe, so they judge nothing by themselves);
- persistence mode (recorded: off costs start-up time, not bandwidth);
- the current clock-slowdown reasons by name. Hardware slowdown, thermal slowdown (software or
  hardware) and the power brake mean the GPU is being held down by something outside the run: a
  failed check. A software power cap under load and sync boost are normal operation;
- pending page retirement / row remapping, and a failed remapping (XID 63/64 territory), the
  uncorrected ECC count (XID 48) and the PCIe replay counter: pending or failed repairs are a failed
  check (the GPU needs a reset before its numbers count), the counters are recorded.
"""
from __future__ import annotations

import contextlib
import os

from gpulab.outcomes import Check, Verdict

# NVML clock event ("throttle") reason bits, by the names nvidia-smi -q uses.
SLOWDOWN_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
# Reasons that mean something outside the run holds the clocks down.
HARDWARE_SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80

CHECK_FOREIGN = "node state: no other compute process on the GPU"
CHECK_SLOWDOWN = "node state: no hardware or thermal clock slowdown"
CHECK_REPAIRS = "node state: no pending page retirement or row remapping"
UNTRUSTWORTHY = "the numbers of this run are not trustworthy"


def reason_names(mask: int) -> list[str]:
    return [n for bit, n in SLOWDOWN_REASONS.items() if mask & bit]


def own_pids(pid: int | None = None, env: dict | None = None) -> set[int]:
    """gpulab's own processes: ``pid`` (this one), its ancestors, and the Snakemake run that started
    it ($GPULAB_OWNER_PID on this host) with every descendant."""
    import socket

    import psutil

    pid = os.getpid() if pid is None else pid
    env = os.environ if env is None else env
    own = {pid}
    with contextlib.suppress(psutil.Error):
        own |= {p.pid for p in psutil.Process(pid).parents()}
    host, _, raw = str(env.get("GPULAB_OWNER_PID", "")).rpartition(":")
    if raw.isdigit() and host == socket.gethostname():
        with contextlib.suppress(psutil.Error):
            owner = psutil.Process(int(raw))
            own |= {owner.pid} | {c.pid for c in owner.children(recursive=True)}
    own.discard(1)
    return own


def _process_name(nv, pid: int) -> str:
    with contextlib.suppress(Exception):
        import psutil

        if not psutil.pid_exists(pid):
            return "not visible from this PID namespace (NVML lists host PIDs in a container)"
    with contextlib.suppress(Exception):
        import psutil

        return " ".join(psutil.Process(pid).cmdline()[:3])[:120] or psutil.Process(pid).name()
    with contextlib.suppress(Exception):
        n = nv.nvmlSystemGetProcessName(pid)
        return n.decode() if isinstance(n, bytes) else str(n)
    return "?"


def _compute_processes(nv, h) -> list:
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3",
               "nvmlDeviceGetComputeRunningProcesses_v2"):
        if hasattr(nv, fn):
            return list(getattr(nv, fn)(h) or [])
    raise AttributeError("no nvmlDeviceGetComputeRunningProcesses")


def gpu_state(nv, h, own: set[int]) -> dict:
    """The node-state fields of one GPU (NVML handle ``h``); a field is missing where NVML did not
    answer. ``foreign`` lists {pid, name, used_memory_bytes} of other tenants."""
    d: dict = {}
    with contextlib.suppress(Exception):
        procs = _compute_processes(nv, h)
        d["foreign"] = [{"pid": int(p.pid), "name": _process_name(nv, int(p.pid)),
                         "used_memory_bytes": int(getattr(p, "usedGpuMemory", 0) or 0)}
                        for p in procs if int(p.pid) not in own]
        d["foreign_processes"] = len(d["foreign"])
    with contextlib.suppress(Exception):
        d["utilization_gpu_pct"] = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
    with contextlib.suppress(Exception):
        d["memory_used_bytes"] = int(nv.nvmlDeviceGetMemoryInfo(h).used)
    with contextlib.suppress(Exception):
        d["persistence_mode"] = bool(nv.nvmlDeviceGetPersistenceMode(h))
    with contextlib.suppress(Exception):
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = int(fn(h))
        d["slowdown_mask"] = mask
        d["slowdown_reasons"] = ",".join(reason_names(mask))
    with contextlib.suppress(Exception):
        d["retired_pages_pending"] = bool(nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
    with contextlib.suppress(Exception):
        _corr, _unc, pending, failed = nv.nvmlDeviceGetRemappedRows(h)
        d["remapped_rows_pending"], d["remapped_rows_failed"] = bool(pending), bool(failed)
    with contextlib.suppress(Exception):
        d["pcie_replay_counter"] = int(nv.nvmlDeviceGetPcieReplayCounter(h))
    return d


def checks(gpus: list[dict]) -> list[Check]:
    """The failed/passed node-state checks of every GPU (dicts carrying ``index`` and the
    :func:`gpu_state` fields); a check NVML could not answer is not applicable."""
    out = []
    for g in gpus:
        case = f"GPU{g['index']}"
        foreign = g.get("foreign")
        if foreign is None:
            out.append(Check.of(CHECK_FOREIGN, case, None, note="NVML did not list processes"))
        else:
            names = "; ".join(f"pid {p['pid']} ({p['name']}, {p['used_memory_bytes'] / 2**30:.2f} GiB)"
                              for p in foreign)
            out.append(Check.of(CHECK_FOREIGN, case, not foreign, value=len(foreign), bound=0,
                                note=f"{names}: {UNTRUSTWORTHY}" if foreign else ""))
        mask = g.get("slowdown_mask")
        if mask is None or mask < 0:
            out.append(Check.of(CHECK_SLOWDOWN, case, None, note="NVML did not answer"))
        else:
            bad = reason_names(int(mask) & HARDWARE_SLOWDOWN)
            out.append(Check.of(CHECK_SLOWDOWN, case, not bad, value=len(bad), bound=0,
                                note=(f"clocks held down by {', '.join(bad)}: {UNTRUSTWORTHY}" if bad
                                      else f"reasons now: {', '.join(reason_names(int(mask))) or 'none'}")))
        flags = {k: g.get(k) for k in ("retired_pages_pending", "remapped_rows_pending",
                                       "remapped_rows_failed")}
        if all(v is None for v in flags.values()):
            out.append(Check.of(CHECK_REPAIRS, case, None, note="NVML did not answer"))
        else:
            bad = [k for k, v in flags.items() if v is True]
            out.append(Check.of(CHECK_REPAIRS, case, not bad, value=len(bad), bound=0,
                                note=(f"{', '.join(bad)}: reset the GPU before measuring" if bad else "")))
    return out


def failures(files, host: str | None = None) -> list[tuple[str, str, str, str]]:
    """(host, check, case, note) of every failed node-state check in the probe results among
    ``files`` (of ``host`` only, where given)."""
    from gpulab import results

    out = []
    for f, a in results.with_attrs(files, "nodestate"):
        if a.get("stage") != "probe" or (host and str(a.get("host")) != host):
            continue
        if "checks" not in results.list_contents(f)["tables"]:
            continue
        c = results.read_table(f, "checks")
        bad = c[c["check"].astype(str).str.startswith("node state") & (c["verdict"] == Verdict.FAIL)]
        out += [(str(a.get("host")), str(r.check), str(r.case), str(r.note)) for r in bad.itertuples()]
    return out
