"""Issue 25: node-state checks before a run (DCGM-like), NVML faked at the pynvml boundary.

One test per check: another compute process on a GPU (gpulab's own excluded), hardware/thermal
clock slowdowns by name, pending or failed memory repairs, NVML not answering; then the probe's
result and `gpulab compare` on a node with a foreign process.
"""
from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from gpulab.probe import nodestate


class FakeNvml:
    """The pynvml calls nodestate makes, answering from plain fields (None: NVML raises)."""

    def __init__(self, procs=(), util=0, used=1 << 20, persistence=1, reasons=0x1,
                 retired_pending=0, remapped=(0, 0, 0, 0), replay=0):
        self.procs, self.util, self.used = (None if procs is None else list(procs)), util, used
        self.persistence, self.reasons = persistence, reasons
        self.retired_pending, self.remapped, self.replay = retired_pending, remapped, replay

    @staticmethod
    def _answer(v):
        if v is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return v

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self._answer(self.procs)]

    def nvmlSystemGetProcessName(self, pid):
        return b"fake-tenant"

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self._answer(self.util), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=self._answer(self.used), total=141 << 30)

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._answer(self.persistence)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._answer(self.reasons)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._answer(self.retired_pending)

    def nvmlDeviceGetRemappedRows(self, h):
        return self._answer(self.remapped)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._answer(self.replay)


def _state(nv, own=frozenset({os.getpid()}), index=0) -> dict:
    return {"index": index, **nodestate.gpu_state(nv, object(), set(own))}


def _check(checks, name):
    (c,) = [c for c in checks if c.check == name]
    return c


def test_a_foreign_compute_process_fails_naming_pid_and_name():
    g = _state(FakeNvml(procs=[(4242, 2 << 30)]))
    assert g["foreign_processes"] == 1 and g["foreign"][0]["pid"] == 4242
    c = _check(nodestate.checks([g]), nodestate.CHECK_FOREIGN)
    assert c.verdict == "fail" and c.case == "GPU0"
    assert "pid 4242" in c.note and "2.00 GiB" in c.note and nodestate.UNTRUSTWORTHY in c.note


def test_gpulabs_own_processes_are_not_foreign():
    me = os.getpid()
    g = _state(FakeNvml(procs=[(me, 1 << 30), (777, 1 << 30)]), own={me, 777})
    assert g["foreign"] == [] and g["foreign_processes"] == 0
    assert _check(nodestate.checks([g]), nodestate.CHECK_FOREIGN).verdict == "pass"


def test_own_pids_cover_ancestors_and_the_snakemake_run_tree(tmp_path):
    import socket
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        own = nodestate.own_pids(env={"GPULAB_OWNER_PID": f"{socket.gethostname()}:{os.getpid()}"})
        assert os.getpid() in own and os.getppid() in own and child.pid in own
        # without the owner variable, a sibling job of the run is not known to be ours
        assert child.pid not in nodestate.own_pids(env={})
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("mask, verdict, named", [
    (0x1, "pass", None),                      # idle
    (0x4 | 0x10, "pass", None),               # sw power cap under load, sync boost: normal
    (0x8, "fail", "hw_slowdown"),
    (0x40 | 0x1, "fail", "hw_thermal_slowdown"),
    (0x20, "fail", "sw_thermal_slowdown"),
    (0x80, "fail", "hw_power_brake_slowdown"),
])
def test_clock_slowdown_reasons_by_name(mask, verdict, named):
    g = _state(FakeNvml(reasons=mask))
    assert g["slowdown_reasons"].split(",") == nodestate.reason_names(mask)
    c = _check(nodestate.checks([g]), nodestate.CHECK_SLOWDOWN)
    assert c.verdict == verdict
    if named:
        assert named in c.note and nodestate.UNTRUSTWORTHY in c.note


@pytest.mark.parametrize("retired, remapped, verdict, named", [
    (0, (0, 0, 0, 0), "pass", None),
    (1, (0, 0, 0, 0), "fail", "retired_pages_pending"),
    (0, (2, 1, 1, 0), "fail", "remapped_rows_pending"),
    (0, (0, 0, 0, 1), "fail", "remapped_rows_failed"),
])
def test_pending_or_failed_memory_repairs_fail(retired, remapped, verdict, named):
    g = _state(FakeNvml(retired_pending=retired, remapped=remapped))
    c = _check(nodestate.checks([g]), nodestate.CHECK_REPAIRS)
    assert c.verdict == verdict
    if named:
        assert named in c.note


def test_state_recorded_utilisation_memory_persistence_replays():
    g = _state(FakeNvml(util=37, used=5 << 30, persistence=0, replay=12))
    assert g["utilization_gpu_pct"] == 37 and g["memory_used_bytes"] == 5 << 30
    assert g["persistence_mode"] is False and g["pcie_replay_counter"] == 12


def test_nvml_not_answering_is_not_applicable_not_a_pass():
    nv = FakeNvml(procs=None, reasons=None, retired_pending=None, remapped=None)
    g = _state(nv)
    assert "foreign" not in g and "slowdown_mask" not in g
    assert {c.verdict for c in nodestate.checks([g])} == {"not_applicable"}


def _probe_with(tmp: Path, host: str, procs=()) -> Path:
    from gpulab import probe, results

    gpu = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1", "pci_bus_id": "0:1", "sm_clock_max_mhz": 1980,
           "pcie_gen_now": 5, "pcie_width_now": 16, "throttle_reasons": 1, "ecc_uncorrected_volatile": 0,
           **nodestate.gpu_state(FakeNvml(procs=procs), object(), {os.getpid()})}
    info = {"host": {"hostname": "m", "cpu_model": "x", "physical_cores": 1, "logical_cpus": 1,
                     "numa_nodes": [], "ram_bytes": 1}, "software": {"torch": "2"}, "gpus": [gpu],
            "has_gpus": True, "peer_access": [[1]], "peer_access_api": "fake", "topology": None,
            "topo_text": None, "nvlink_status_smi": [], "nvlink_caps_smi": []}
    old = os.environ.get("GPULAB_HOST")
    os.environ["GPULAB_HOST"] = host
    try:
        out = tmp / "probe" / f"{host}.h5"
        results.write(probe.build_result("probe", "main", {}, info), out)
    finally:
        os.environ.pop("GPULAB_HOST") if old is None else os.environ.__setitem__("GPULAB_HOST", old)
    return out


def test_probe_result_records_foreign_processes_and_a_failed_check(tmp_path):
    from gpulab import results

    f = _probe_with(tmp_path, "n1", procs=[(31337, 1 << 30)])
    fp = results.read_table(f, "foreign_processes")
    assert list(fp["pid"]) == [31337] and list(fp["gpu"]) == [0]
    fails = nodestate.failures([f])
    assert len(fails) == 1 and fails[0][0] == "n1" and "pid 31337" in fails[0][3]
    assert results.read_attrs(f)["verdict"] == "fail"


def test_compare_fails_on_a_foreign_process_naming_it(tmp_path, capsys):
    from gpulab import cli

    healthy, loaded = tmp_path / "healthy", tmp_path / "loaded"
    _probe_with(healthy, "n1")
    _probe_with(loaded, "n1", procs=[(31337, 1 << 30)])
    bdir = tmp_path / "b"
    assert cli.main(["baseline", "save", "ref", str(healthy), "--baselines-dir", str(bdir)]) == 0
    assert cli.main(["compare", "ref", "--results-dir", str(healthy), "--baselines-dir", str(bdir)]) == 0
    capsys.readouterr()
    assert cli.main(["compare", "ref", "--results-dir", str(loaded), "--baselines-dir", str(bdir)]) == 1
    out = capsys.readouterr().out
    assert "pid 31337" in out and "health verdict: FAIL" in out and nodestate.UNTRUSTWORTHY in out
    row = [ln for ln in out.splitlines() if "probe/gpu=0/foreign_processes" in ln]
    assert row and row[0].rstrip().endswith("regression")


def test_node_state_is_read_through_pynvml_by_bus_id(monkeypatch):
    """The probe's own path: pynvml imported, every GPU by index, keyed by the PCI bus id as the
    CUDA runtime spells it, a tenant found."""
    import sys

    from gpulab.probe import gpus

    fake = FakeNvml(procs=[(4243, 1 << 30)], reasons=0x40)
    mod = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:19:00.0"),
        **{k: getattr(fake, k) for k in dir(FakeNvml) if k.startswith("nvml")})
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    state = gpus.node_state_by_bus({os.getpid()})
    st = state[gpus._bus_key("0000:19:00.0")]
    assert st["foreign_processes"] == 1 and st["foreign"][0]["pid"] == 4243
    assert "hw_thermal_slowdown" in st["slowdown_reasons"]
