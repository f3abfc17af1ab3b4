"""Transfer stage: conventions, seed parser, matrices, the CPU path end to end, config errors, report.

The GPU path (CuPy runtime calls) cannot run here; its pure helpers are tested, and the report is
rendered from a GPU-shaped result built with the stage's own table/bar builders.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import stage_settings
from gpulab import config as cfgmod
from gpulab import devices, outcomes, results, stages
from gpulab import seedref
from gpulab.kit.html import Figures
from gpulab.transfer import bars, hostmem, matrices, measure
from gpulab.transfer.hybrid import split_bytes
from gpulab.transfer.isolate import run_isolated
from gpulab.transfer.malloc import _bins, bin_times

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "p2pBandwidthLatencyTest_a5000.txt"

TINY = {"warmup": 1, "repeats": 2, "copies": 2, "matrix_bytes": 65536, "latency_copies": 10,
        "host_sizes": [4096, 65536], "sweep_target_bytes": 262144, "host_threads": [1, 2],
        "host_threads_bytes": 65536}


def test_seed_table_parses_into_the_papers_matrices():
    ref = seedref.parse(FIXTURE.read_text())
    assert ref.keys() == seedref.seed_reference().keys()  # the packaged copy is the same table
    for k in ref:
        np.testing.assert_array_equal(ref[k], seedref.seed_reference()[k])
    assert ref["uni_ce_p2p_enabled_GBps"][0, 1] == 52.71
    assert ref["bi_ce_p2p_disabled_GBps"][1, 0] == 29.42
    assert ref["latency_ce_p2p_disabled_cpu_us"][1, 1] == 3.28
    assert ref["latency_ce_p2p_enabled_gpu_us"].shape == (2, 2)
    assert len(ref) == 8


def test_seed_parser_rejects_other_text():
    with pytest.raises(ValueError, match="not p2pBandwidthLatencyTest output"):
        seedref.parse("hello\nworld\n")


def test_counting_conventions():
    assert measure.bytes_moved(100, 5, same_device=False) == 500
    assert measure.bytes_moved(100, 5, same_device=True) == 1000  # read + write
    assert measure.bytes_moved(100, 5, same_device=False, bidirectional=True) == 1000
    assert measure.bytes_moved(100, 5, same_device=True, bidirectional=True) == 2000
    assert measure.copies_for(4096, 5, 1 << 20) == 256
    assert measure.copies_for(1 << 30, 5, 1 << 20) == 5
    assert measure.copies_for(16, 5, 1 << 30) == measure.MAX_COPIES
    row = measure.bandwidth_row([0.5, 0.25, 1.0], 10**9, test="uni")
    assert row["value_median"] == pytest.approx(2.0) and row["value_max"] == pytest.approx(4.0)
    assert row["value_min"] == pytest.approx(1.0) and row["spread"] == pytest.approx(1.5)
    lat = measure.latency_row([1e-3, 2e-3], 100)
    assert lat["value_median"] == pytest.approx(15.0) and lat["unit"] == "us" and lat["copies"] == 100


def test_matrices_from_rows_leave_unmeasured_cells_empty():
    rows = pd.DataFrame([
        {"test": "uni", "mechanism": "ce", "p2p": "enabled", "metric": "bandwidth", "src": s, "dst": d,
         "value_median": 10.0 * s + d} for s in range(2) for d in range(2)]
        + [{"test": "uni", "mechanism": "sm", "p2p": "disabled", "metric": "bandwidth", "src": 0, "dst": 0,
            "value_median": 7.0}])
    out = matrices.build(rows, 2)
    m, meta = out["uni_ce_p2p_enabled_GBps"]
    np.testing.assert_array_equal(m, [[0, 1], [10, 11]])
    assert meta["unit"] == "GB/s" and meta["rows"] == ["GPU0", "GPU1"]
    assert "P2P=Enabled Bandwidth (P2P Writes)" in meta["title"]
    sm, _ = out["uni_sm_p2p_disabled_GBps"]
    assert sm[0, 0] == 7.0 and np.isnan(sm[0, 1]) and np.isnan(sm[1, 1])


def test_helpers_for_gpu_parts():
    assert _bins(10) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 10)]
    t = bin_times(np.arange(20, dtype=float).reshape(2, 10) * 1e-6, peer_access="without")
    assert list(t["prior_from"]) == [0, 1, 2, 4, 8] and list(t["samples"]) == [2, 2, 4, 8, 4]
    assert t["time_us_median"].iloc[0] == pytest.approx(5.0)  # calls 0 and 10 of the two rounds
    n = 1 << 28
    p = split_bytes(n, 8.0)
    assert p % 4096 == 0 and abs(p - n * 8 / 9) <= 4096
    assert split_bytes(n, 0.0) == 0


@pytest.mark.slow
def test_isolated_phase_runs_in_a_fresh_process_and_reports_errors(monkeypatch):
    monkeypatch.setenv("GPULAB_TEST_MARK", "x")
    # builtins / os functions: the spawned child needs no test-module import to unpickle them
    assert run_isolated(os.getpid) != os.getpid()
    assert run_isolated(os.getenv, "GPULAB_TEST_MARK") == "x"
    with pytest.raises(ValueError, match="invalid literal"):
        run_isolated(int, "not a number")


def test_host_memcpy_measures_and_verifies():
    sw = hostmem.memcpy_sweep([4096, 65536], 0, 2, 2, 1 << 18, seed=1)
    assert list(sw["bytes"]) == [4096, 65536] and sw["verified"].all()
    assert (sw["value_median"] > 0).all()
    np.testing.assert_allclose(sw["value_median"], sw["bytes_per_sample"] / sw["time_s_median"] / 1e9)
    th = hostmem.thread_scaling([1, 2], 65536, 0, 2, 2, seed=1)
    assert list(th["threads"]) == [1, 2] and th["verified"].all()
    assert list(th["bytes_per_sample"]) == [2 * 65536, 4 * 65536]


def test_config_defaults_and_errors_name_the_key():
    cfg = stage_settings("transfer")
    assert cfg.copies == 5 and cfg.latency_bytes == 16 and cfg.gpus == "all"
    with pytest.raises(cfgmod.ConfigError, match=r"key 'transfer.matrix_bytes'.*multiple of 16"):
        stage_settings("transfer", matrix_bytes=1000)
    with pytest.raises(cfgmod.ConfigError, match=r"key 'transfer.p2p_sizes\[1\]'"):
        stage_settings("transfer", p2p_sizes=[4096, 0])
    with pytest.raises(cfgmod.ConfigError, match="nonsense"):
        stage_settings("transfer", nonsense=1)


@pytest.fixture(scope="module")
def cpu_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("transfer") / "main.h5"
    payload = {"stage": TINY, "devices": {"backend": "cpu", "cpu_devices": 2}}
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "transfer.py"), "--config-json",
                        json.dumps(payload), "--out", str(out)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "GPULAB_HOST": "cpuhost"})
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.mark.slow
def test_cpu_run_writes_matrices_tables_and_not_applicable_records(cpu_result):
    a = results.read_attrs(cpu_result)
    assert a["device_kind"] == "cpu" and a["device_count"] == 2 and "read+write" in a["conventions"]
    checks = results.read_table(cpu_result, "checks")
    # every measured row (2x2 cells x uni/bi/latency, 2 memcpy sizes, 2 thread counts) read back equal
    assert len(checks) == 12 + 2 + 2 and (checks["check"] == "copy verified").all()
    assert (checks["verdict"] == "pass").all() and a["verdict"] == "pass"
    assert a["verdict_summary"].split(": ", 1)[1].startswith("16 of 16 checks passed")  # after the judged count
    c = results.list_contents(cpu_result)
    assert set(stages.get("transfer").tables) <= set(c["tables"])
    assert {"p2p", "host_memcpy", "host_threads", "bars", "checks", "not_applicable"} <= set(c["tables"])
    for name in ("uni_memcpy_GBps", "bi_memcpy_GBps", "latency_memcpy_cpu_us"):
        m, meta = results.read_matrix(cpu_result, name)
        assert m.shape == (2, 2) and np.isfinite(m).all() and (m > 0).all()
        assert meta["rows"] == ["CPU0", "CPU1"]
    assert "ref_a5000_uni_ce_p2p_enabled_GBps" in c["matrices"]
    p2p = results.read_table(cpu_result, "p2p")
    assert p2p["verified"].all() and len(p2p) == 2 * 2 * 3
    same = p2p[(p2p.test == "uni") & (p2p.src == p2p.dst)]
    assert (same["bytes_per_sample"] == 2 * 65536 * 2).all()  # read+write on the diagonal
    bars_ = results.read_table(cpu_result, "bars")
    assert list(bars_.columns) == outcomes.BAR_COLUMNS and (bars_["verdict"] == "not_applicable").all()
    assert bars_["note"].str.contains("needs a CUDA GPU").all()
    na = results.read_table(cpu_result, "not_applicable")
    assert list(na.columns) == ["what", "reason"]
    assert any("hybrid" in m for m in na["what"]) and (na["reason"] != "").all()
    units = results.read_table(cpu_result, "host_memcpy").attrs["units"]
    assert units["time_s_median"] == "s" and units["bytes"] == outcomes.UNITS["bytes"]


@pytest.fixture(scope="module")
def gpu_result(tmp_path_factory) -> Path:
    """A result with the GPU path's layout, built by the stage's own builders (numbers made up)."""
    rows = []
    for p2p in ("disabled", "enabled"):
        for s in range(2):
            for d in range(2):
                for test, metric in (("uni", "bandwidth"), ("bi", "bandwidth"), ("latency", "latency_gpu"),
                                     ("latency", "latency_cpu")):
                    row = (measure.bandwidth_row([0.01, 0.011], 10**9 * (4 if s == d else 1), test=test)
                           if metric == "bandwidth" else measure.latency_row([2e-4, 3e-4], 100, test=test))
                    rows.append({"copies": 5, **row, "metric": metric, "mechanism": "ce", "p2p": p2p,
                                 "src": s, "dst": d, "bytes": 160000000, "verified": True})
    p2p_rows = pd.DataFrame(rows)
    r = results.Result("transfer", "main", {}, "cuda")
    r.attrs.update({"gpu_names": ["NVIDIA H200", "NVIDIA H200"], "device_count": 2,
                    "isolation_check": "peer access stayed off", "verify_p2p": "all copies verified"})
    r.add_table("p2p", p2p_rows)
    for name, (m, meta) in matrices.build(p2p_rows, 2).items():
        r.add_matrix(name, m, **meta)
    for name, m in seedref.seed_reference().items():
        r.add_matrix(f"ref_a5000_{name}", m, "us" if name.endswith("us") else "GB/s", rows=["GPU0", "GPU1"],
                     cols=["GPU0", "GPU1"])
    torch_d2d = pd.DataFrame([{**measure.bandwidth_row([0.0105], 4 * 10**9), "device": d, "bytes": 160000000,
                               "copies": 5} for d in range(2)])
    r.add_table("torch_d2d", torch_d2d)
    h2d = {"mine": {**measure.bandwidth_row([0.1], 5 * 10**9), "bytes": 1 << 30, "copies": 5},
           "torch": measure.bandwidth_row([0.1], 5 * 10**9)}
    hd = pd.DataFrame([{**measure.bandwidth_row([1e-3], 10**6 * k), "direction": dr, "memory": mem,
                        "call": call, "bytes": 4096 * k, "copies": 5} for k in (1, 4) for dr in ("H2D", "D2H")
                       for mem in ("pinned", "pageable") for call in ("async", "blocking")])
    r.add_table("bars", outcomes.bars_frame(bars.gpu_bars(p2p_rows, ["NVIDIA H200"] * 2, LINKS_NV18, h2d, hd)))
    r.add_table("checks", outcomes.checks_frame(bars.harness_checks(p2p_rows, torch_d2d, h2d)))
    sweep = pd.DataFrame([{**measure.bandwidth_row([1e-3], 10**6 * k), "mechanism": "ce", "p2p": "enabled",
                           "src": 0, "dst": 1, "bytes": 4096 * k} for k in (1, 4, 16)])
    r.add_table("p2p_sweep", sweep)
    r.add_table("host_device", hd)
    r.add_table("malloc", pd.DataFrame([{"peer_access": pa, "peers": pe, "prior_from": a, "prior_to": b,
                                         "alloc_bytes": 2 << 20, "time_us_median": 10.0 + a}
                                        for pa, pe in (("without", 0), ("with", 1))
                                        for a, b in ((0, 0), (1, 1), (2, 3))]))
    return results.write(r, tmp_path_factory.mktemp("gpu") / "gpu.h5")


def test_gpu_bars_compare_with_physical_limits_and_harness_checks_are_labelled(gpu_result):
    b = results.read_table(gpu_result, "bars").set_index("bar")
    assert list(results.read_table(gpu_result, "bars").columns) == outcomes.BAR_COLUMNS
    hbm = b.loc["same-device copy vs datasheet memory bandwidth, GPU0"]
    # 4e9 B read+write in 10.5 ms = 381 GB/s against the H200's 4800 GB/s: far below, so it fails
    assert hbm["reference"] == 4800 and "H200" in hbm["source"] and hbm["verdict"] == "fail"
    assert "read+write" in hbm["note"] and hbm["ratio"] == pytest.approx(hbm["measured"] / 4800)
    assert b.loc["pinned H2D vs PCIe limit, GPU0", "reference"] == pytest.approx(16 * 3.9385)
    assert "PCIe Gen5 x16" in b.loc["pinned H2D vs PCIe limit, GPU0", "source"]
    assert b.loc["P2P GPU0->GPU1 vs link limit", "reference"] == 450  # NV18 through NVSwitch: all links
    ch = results.read_table(gpu_result, "checks")
    assert (ch["check"] == "harness overhead").all() and len(ch) == 2 * 2 + 1
    assert ch["note"].str.contains("not a performance result").all()
    same = ch[ch.case.str.startswith("same-device copy")]
    # gpulab's copy (4e9 B in 10/11 ms) vs torch's (4e9 B in 10.5 ms): within 5%
    assert (same["verdict"] == "pass").all() and (same["bound"] == 0.95).all()


def _diag_rows(gbps: float, nbytes: int = 1 << 28, resident: bool = False) -> pd.DataFrame:
    """Same-device and cross-device copy-engine rows of a 2-GPU P2P=Enabled run at ``gbps``."""
    rows = []
    for s_ in range(2):
        for d in range(2):
            moved = nbytes * 5 * (2 if s_ == d else 1)
            rows.append({**measure.bandwidth_row([moved / gbps / 1e9] * 3, moved), "test": "uni",
                         "mechanism": "ce", "p2p": "enabled", "src": s_, "dst": d, "bytes": nbytes,
                         "copies": 5, "peer_access": s_ != d, "cache_resident": resident})
    return pd.DataFrame(rows)


LINKS_NV18 = [{"pcie_gen_max": 5, "pcie_width_max": 16, "pcie_gen_now": 5, "pcie_width_now": 16,
               "nvlinks": 18, "nvlinks_to": {}, "nvlinks_switch": 18} for _ in range(2)]


def test_hbm_bar_passes_a_healthy_copy_and_fails_a_slowed_one():
    names = ["NVIDIA H200"] * 2
    ok = bars.hbm_bars(_diag_rows(4003.0), names)  # the README's H200 figure, read+write
    assert [b.verdict for b in ok] == ["pass", "pass"] and ok[0].ratio == pytest.approx(4003 / 4800)
    slow = bars.hbm_bars(_diag_rows(4003.0 / 2), names)  # injected 2x slowdown
    assert [b.verdict for b in slow] == ["fail", "fail"]
    cached = bars.hbm_bars(_diag_rows(9000.0, nbytes=1 << 20, resident=True), names)
    assert {b.verdict for b in cached} == {"not_applicable"} and "L2" in cached[0].note
    unknown = bars.hbm_bars(_diag_rows(4003.0), ["Mystery GPU 9000"] * 2)
    assert {b.verdict for b in unknown} == {"not_applicable"} and "limits.yaml" in unknown[0].note


def _hd(d2h_gbps: float) -> pd.DataFrame:
    return pd.DataFrame([{**measure.bandwidth_row([(5 << 30) / d2h_gbps / 1e9], 5 << 30), "direction": "D2H",
                          "memory": "pinned", "call": "async", "bytes": 1 << 30, "copies": 5}])


def test_pcie_bars_against_the_trained_link_and_a_degraded_measurement_fails():
    h2d = {"mine": {**measure.bandwidth_row([5 / 55.4], 5 * 10**9), "bytes": 10**9, "copies": 5}}
    ok = bars.pcie_bars(h2d, _hd(56.0), LINKS_NV18[0])
    assert [b.verdict for b in ok] == ["pass", "pass"]
    assert ok[0].ratio == pytest.approx(55.4 / (16 * 3.9385)) and "Gen5 x16" in ok[0].note
    slow = {"mine": {**h2d["mine"], **measure.bandwidth_row([5 / 20.0], 5 * 10**9)}}
    bad = bars.pcie_bars(slow, _hd(20.0), LINKS_NV18[0])  # as if the GPU sat behind a Gen4 x8 switch
    assert [b.verdict for b in bad] == ["fail", "fail"]
    degraded = {**LINKS_NV18[0], "pcie_gen_now": 3, "pcie_width_now": 8}
    assert "degraded link" in bars.pcie_bars(slow, _hd(20.0), degraded)[0].note
    unknown = bars.pcie_bars(h2d, _hd(56.0), {})  # no NVML: no generation or width
    assert {b.verdict for b in unknown} == {"not_applicable"} and "not known" in unknown[0].note


def test_p2p_bars_use_the_pairs_link_and_fail_when_slow():
    names = ["NVIDIA H200"] * 2
    rows = _diag_rows(380.0)
    nv = bars.p2p_bars(rows, names, LINKS_NV18)
    assert [b.bar for b in nv] == ["P2P GPU0->GPU1 vs link limit", "P2P GPU1->GPU0 vs link limit"]
    assert all(b.verdict == "pass" and b.reference == 450 and "NVLink" in b.note for b in nv)
    assert [b.verdict for b in bars.p2p_bars(_diag_rows(380.0 / 3), names, LINKS_NV18)] == ["fail", "fail"]
    # A5000 pair on a 4-link bridge out of 4: the bridge's full 56.25 GB/s per direction
    bridge = [{"nvlinks": 4, "nvlinks_to": {1 - k: 4}, "nvlinks_switch": 0} for k in range(2)]
    a5k = bars.p2p_bars(_diag_rows(52.7), ["NVIDIA RTX A5000"] * 2, bridge)
    assert all(b.reference == pytest.approx(56.25) and b.verdict == "pass" for b in a5k)
    pcie = [{"pcie_gen_max": 4, "pcie_width_max": 16, "nvlinks": 0, "nvlinks_to": {}, "nvlinks_switch": 0}] * 2
    pc = bars.p2p_bars(_diag_rows(10.0), ["NVIDIA GeForce RTX 4090"] * 2, pcie)
    assert all(b.verdict == "fail" and "PCIe" in b.note for b in pc)  # 10 of 31.5 GB/s
    assert {b.verdict for b in bars.p2p_bars(rows, names, [{}, {}])} == {"not_applicable"}
    one = bars.p2p_bars(rows[rows.src == rows.dst], ["NVIDIA H200"], LINKS_NV18[:1])
    assert [b.verdict for b in one] == ["not_applicable"] and "needs >= 2 GPUs" in one[0].note


def test_nvlink_share_of_a_pair():
    direct = [{"nvlinks": 4, "nvlinks_to": {1: 2, 2: 2}, "nvlinks_switch": 0},
              {"nvlinks": 2, "nvlinks_to": {0: 2}, "nvlinks_switch": 0},
              {"nvlinks": 2, "nvlinks_to": {0: 2}, "nvlinks_switch": 0}]
    assert devices.nvlink_share(direct, 0, 1) == 0.5 and devices.nvlink_share(direct, 1, 2) == 0.0
    assert devices.nvlink_share(LINKS_NV18, 0, 1) == 1.0
    assert devices.nvlink_share([{}, {}], 0, 1) is None


def test_harness_and_spread_checks_fail_on_a_slowed_harness():
    rows = _diag_rows(4000.0)
    rows = pd.concat([rows, rows.assign(p2p="disabled")], ignore_index=True)
    torch_ref = pd.DataFrame([{**measure.bandwidth_row([1.0], 4000 * 10**9), "device": d} for d in range(2)])
    h2d = {"mine": {**measure.bandwidth_row([0.1, 0.1, 0.2], 5 * 10**9)},
           "torch": measure.bandwidth_row([0.1], 5 * 10**9)}
    ok = bars.harness_checks(rows, torch_ref, h2d)
    assert [c.verdict for c in ok] == ["pass"] * 5
    slowed = rows.assign(value_median=rows.value_median * 0.8)  # an injected 20% harness overhead
    assert [c.verdict for c in bars.harness_checks(slowed, torch_ref, h2d)][:4] == ["fail"] * 4
    spread = bars.spread_checks(rows, h2d)
    assert [c.verdict for c in spread] == ["pass", "pass", "fail"]  # H2D samples 0.1..0.2 s: 100% spread


def test_spin_kernel_timeouts_are_retried_then_fail_the_check():
    from gpulab.transfer import p2p

    assert p2p.queued(1000) == measure.MAX_QUEUED == 256 and p2p.queued(5) == 5
    assert measure.copies_for(16, 5, 1 << 30) <= measure.MAX_QUEUED
    assert p2p.cache_resident(1 << 20, True, 50 << 20) and not p2p.cache_resident(1 << 26, True, 50 << 20)
    assert p2p.cache_resident(30 << 20, False, 50 << 20) and not p2p.cache_resident(30 << 20, True, 50 << 20)
    assert not p2p.cache_resident(16, True, 0)  # L2 size unknown: never marked

    bench = p2p.P2PBench.__new__(p2p.P2PBench)
    bench.cfg, bench.spin_timeouts = stage_settings("transfer", warmup=1, repeats=3), 0
    outcomes_ = iter([False,  # warm-up
                      True, False,  # sample 1: timed out, the retry is valid
                      False,  # sample 2
                      True, True, True])  # sample 3: timed out every time -> dropped, counted
    bench._sample = lambda i, issue, others=(): (1e-3, 1e-4, next(outcomes_))
    gpu, cpu = bench._samples(0, None)
    assert len(gpu) == 2 and bench.spin_timeouts == 1
    table = pd.DataFrame([{"test": "uni", "src": 0, "dst": 0, "bytes": 4096, "spin_timeouts": 1},
                          {"test": "uni", "src": 0, "dst": 0, "bytes": 65536, "spin_timeouts": 0}])
    assert [c.verdict for c in bars.spin_checks({"p2p_sweep": table})] == ["fail", "pass"]


@pytest.mark.slow
def test_report_section_renders_cpu_and_gpu_results(cpu_result, gpu_result):
    import importlib

    sec = importlib.import_module(stages.get("transfer").section_module())
    assert sec.__name__ == "gpulab.transfer.section"

    gpu = gpu_result
    html = sec.render([cpu_result, gpu], Figures())
    assert html.count("<figure") >= 6 and "Bars on" in html and "Not applicable on cpuhost" in html
    assert "P2P=Disabled isolation" in html and "RTX A5000" in html
    lines = sec.headlines([gpu, cpu_result])
    assert lines[0].startswith("Same-device copy:") and "GB/s (read+write) on NVIDIA H200" in lines[0]
    assert "of its limit, fail)" in lines[0]  # the made-up copy is far below the H200's HBM
    assert "GPU-GPU P2P" in lines[0] and "Host memcpy" in lines[1]
    ref = sec.references([gpu, cpu_result])
    assert list(ref.columns) == ["metric", "measured", "reference", "source", "fraction"]
    a5000 = ref[ref.metric.str.startswith("GPU-GPU P2P uni")].iloc[0]
    assert a5000["reference"] == pytest.approx((52.71 + 52.9) / 2)
    hbm = ref[ref.metric.str.startswith("same-device copy vs datasheet memory bandwidth, GPU0")].iloc[0]
    assert hbm["reference"] == 4800 and "H200" in hbm["source"]
    assert "4300" not in sec.METHODS and not hasattr(sec, "H200_TORCH_D2D_GBPS")
    assert not ref.metric.str.contains("cpuhost").any()  # CPU results have no GPU references
    assert "<p>" in sec.METHODS and "read + write" in sec.METHODS


def test_isolation_check_fails_when_peer_access_leaked():
    assert bars.isolation_check(1, 0, True, "a single GPU has no peer").verdict == "not_applicable"
    assert bars.isolation_check(2, 2, True, "stayed off").verdict == "pass"
    leaked = bars.isolation_check(2, 2, False, "CONTAMINATED: peer access was on for ['0->1']")
    assert leaked.verdict == "fail" and "CONTAMINATED" in leaked.note
    assert outcomes.overall({"checks": outcomes.checks_frame([leaked])})["verdict"] == "fail"


def _pinned_rows(device: int, gbps: float, nbytes: int = 1 << 30) -> list[dict]:
    moved = nbytes * 5
    return [{**measure.bandwidth_row([moved / gbps / 1e9] * 3, moved), "direction": dr,
             "memory": "pinned", "call": "async", "device": device, "bytes": nbytes, "copies": 5}
            for dr in ("H2D", "D2H")]


def test_pinned_links_barred_on_every_gpu_and_a_degraded_gpu3_fails():
    # issue 24: only GPU0's link was barred; GPU3 trained to x8 (of x16) must fail.
    links = [{**LINKS_NV18[0]} for _ in range(4)]
    links[3] = {**links[3], "pcie_width_now": 8}
    h2d = {"mine": {**measure.bandwidth_row([5 / 55.4], 5 * 10**9), "bytes": 1 << 30, "copies": 5}}
    per_gpu = pd.DataFrame(_pinned_rows(1, 55.0) + _pinned_rows(2, 54.0) + _pinned_rows(3, 27.0))
    got = {b.bar: b for b in bars.link_bars(h2d, _hd(56.0), per_gpu, links)}
    assert len(got) == 8
    for d in range(3):
        assert got[f"pinned H2D vs PCIe limit, GPU{d}"].verdict == "pass"
        assert got[f"pinned D2H vs PCIe limit, GPU{d}"].verdict == "pass"
    for what in ("H2D", "D2H"):
        b = got[f"pinned {what} vs PCIe limit, GPU3"]
        assert b.verdict == "fail" and "degraded link" in b.note
    all_bars = bars.gpu_bars(_diag_rows(4003.0), ["NVIDIA H200"] * 2, links, h2d, _hd(56.0), per_gpu)
    assert "pinned D2H vs PCIe limit, GPU3" in {b.bar for b in all_bars}


def test_small_host_copies_are_issue_rate_bound_and_judge_no_link():
    assert measure.bound_by(64 << 10) == measure.ISSUE_BOUND and measure.bound_by(1 << 20) == "link"
    small = {"mine": {**measure.bandwidth_row([1e-3], 5 * 65536), "bytes": 65536, "copies": 5}}
    hd = pd.DataFrame([{**measure.bandwidth_row([1e-3], 5 * 65536), "direction": "D2H",
                        "memory": "pinned", "call": "async", "bytes": 65536, "copies": 5}])
    got = bars.pcie_bars(small, hd, LINKS_NV18[0])
    assert {b.verdict for b in got} == {"not_applicable"}
    assert all("issue-rate bound, not link bound" in b.note for b in got)


def test_nvlink_without_peer_access_fails_and_pcie_without_it_is_not_applicable():
    rows = _diag_rows(20.0).assign(peer_access=False)
    nv = bars.p2p_bars(rows, ["NVIDIA H200"] * 2, LINKS_NV18)
    assert [b.verdict for b in nv] == ["fail", "fail"] and "no peer access" in nv[0].note
    pcie = [{"pcie_gen_max": 4, "pcie_width_max": 16, "nvlinks": 0, "nvlinks_to": {},
             "nvlinks_switch": 0}] * 2
    assert {b.verdict for b in bars.p2p_bars(rows, ["NVIDIA L40S"] * 2, pcie)} == {"not_applicable"}


def test_switch_links_only_when_the_remote_is_an_nvswitch():
    # 4-GPU direct mesh (4 links to each peer), 2 GPUs visible: 4 of 12 links reach the peer.
    visible = ["0000:01:00.0", "0000:02:00.0"]
    mesh = [("0000:02:00.0", "gpu")] * 4 + [("0000:03:00.0", "gpu")] * 4 + [("0000:04:00.0", "gpu")] * 4
    a = devices.count_nvlinks(mesh, visible)
    b = devices.count_nvlinks([(r.replace("02", "01") if r == visible[1] else r, k) for r, k in mesh],
                              visible)
    assert a == {"nvlinks": 12, "nvlinks_to": {1: 4}, "nvlinks_switch": 0, "nvlinks_unknown": 0}
    assert devices.nvlink_share([a, b], 0, 1) == pytest.approx(1 / 3)
    hgx = devices.count_nvlinks([(f"0000:{0xa0 + k:02x}:00.0", "switch") for k in range(18)], visible)
    assert devices.nvlink_share([hgx, hgx], 0, 1) == 1.0
    unknown = devices.count_nvlinks([("0000:99:00.0", "unknown")] * 2, visible)
    assert unknown["nvlinks_switch"] == 0 and unknown["nvlinks"] == 2
    # NVML that cannot name a link's far end: the share is unknown, not guessed either way
    assert devices.nvlink_share([unknown, unknown], 0, 1) is None


def test_every_bandwidth_row_is_checked_against_its_physical_limit():
    # issue 24: a figure above 1.05 x its physical limit is a failed check and fails its bar.
    names, links = ["NVIDIA H200"] * 2, LINKS_NV18
    impossible = _diag_rows(40000.0)  # 40 TB/s: 8x the H200's memory bandwidth
    checks = bars.plausibility_checks(impossible, names, links, [])
    assert checks and {c.verdict for c in checks} == {"fail"}
    assert all("exceeds the physical limit" in c.note for c in checks)
    assert {c.verdict for c in bars.plausibility_checks(_diag_rows(380.0), names, links, [])} \
        == {"pass"}
    host = pd.DataFrame(_pinned_rows(0, 80.0) + _pinned_rows(1, 55.0))  # 80 > 1.05 x 63 GB/s
    hc = {c.case: c.verdict for c in bars.plausibility_checks(impossible.iloc[:0], names, links,
                                                                [host])}
    assert sorted(hc.values()) == ["fail", "fail", "pass", "pass"]
    hbm = bars.gpu_bars(impossible, names, links, {}, pd.DataFrame())
    top = [b for b in hbm if b.bar.startswith("same-device")]
    assert {b.verdict for b in top} == {"fail"} and "exceeds the physical limit" in top[0].note


def test_hybrid_and_host_thread_rows_are_checked_against_the_paths_they_use():
    # issue 24: every bandwidth row, the hybrid split and the multi-GPU host-thread rows included.
    names, links = ["NVIDIA H200"] * 2, LINKS_NV18
    nv = bars.p2p_limit(names, links, 0, 1)[0].value      # the pair's NVLink share (datasheet)
    pcie = bars.pcie_limit(links[0]).value                 # Gen5 x16
    n = 1 << 26

    def hyb(path, gbps, p2p_bytes):
        return {**measure.bandwidth_row([n / gbps / 1e9] * 3, n), "path": path, "src": 0,
                "dst": 1, "bytes": n, "p2p_bytes": p2p_bytes, "host_bytes": n - p2p_bytes}

    healthy = pd.DataFrame([hyb("p2p only", 0.8 * nv, n), hyb("host only", 0.8 * pcie, 0),
                            hyb("split R/(1+R)", 0.8 * (nv + pcie), n // 2)])
    got = bars.plausibility_checks(healthy.iloc[:0], names, links, [], hybrid=healthy)
    assert [c.verdict for c in got] == ["pass"] * 3
    # a host-staged copy faster than PCIe, a split faster than both paths together: impossible
    bad = pd.DataFrame([hyb("host only", 1.2 * pcie, 0), hyb("split R/(1+R)", 1.2 * (nv + pcie),
                                                               n // 2)])
    got = bars.plausibility_checks(bad.iloc[:0], names, links, [], hybrid=bad)
    assert [c.verdict for c in got] == ["fail", "fail"] and "exceeds" in got[0].note

    def thr(gbps):
        return {**measure.bandwidth_row([2 * n / gbps / 1e9] * 3, 2 * n), "threading": "one thread per GPU",
                "call": "async", "direction": "H2D", "memory": "pinned", "gpus": 2, "bytes": n}

    got = bars.plausibility_checks(healthy.iloc[:0], names, links, [],
                                   threads=pd.DataFrame([thr(1.8 * pcie), thr(2.3 * pcie)]))
    assert [c.verdict for c in got] == ["pass", "fail"]  # limit: 2 x PCIe


def test_schema_states_the_copy_cap_the_code_uses():
    # issue 24: the schema said "at most 1000" copies while the code caps at 256.
    import yaml

    from conftest import REPO

    text = (REPO / "src/gpulab/transfer/schema.yaml").read_text()
    desc = yaml.safe_load(text)["properties"]["sweep_target_bytes"]["description"]
    assert f"at most {measure.MAX_COPIES}" in desc and "1000" not in desc
    assert measure.copies_for(1, 1, 1 << 40) == measure.MAX_COPIES
    gpu = (REPO / "workflow/presets/gpu.yaml").read_text()
    assert "issue 8" not in gpu
    # a measured figure written into a comment goes stale (gemm/single.py said H200 bf16 "0.67")
    assert "0.67" not in (REPO / "src/gpulab/gemm/single.py").read_text()


def test_gpu_path_wires_every_link_bar_and_the_plausibility_checks(monkeypatch):
    # The GPU phases faked at their process boundary (run_isolated): the stage's own assembly
    # must bar GPU1's link from its own copies and check every row against its physical limit.
    import gpulab.transfer as tr
    from gpulab.transfer import isolate

    rows = _diag_rows(4003.0).assign(metric="bandwidth")
    dis = {"p2p": rows.assign(p2p="disabled"), "sweep": rows.iloc[:0], "malloc": pd.DataFrame(),
           "connectivity": [[True, True], [True, True]], "isolation_check": "ok",
           "isolation_ok": True, "isolation_pairs": 2, "gpu_names": ["NVIDIA H200"] * 2,
           "l2_bytes": [0, 0]}
    ena = {"p2p": rows, "sweep": _diag_rows(40000.0, nbytes=1 << 26).assign(metric="bandwidth"), "malloc": pd.DataFrame(),
           "torch_d2d": pd.DataFrame([{**measure.bandwidth_row([0.001], 4 * 10**9), "device": d,
                                       "bytes": 1 << 28, "copies": 5} for d in range(2)])}
    hd = pd.DataFrame(_pinned_rows(0, 55.0))
    hst = {"host_device": hd, "host_device_threads": pd.DataFrame(),
           "h2d_bar": {"mine": hd.iloc[0].to_dict(), "torch": hd.iloc[0].to_dict()},
           "host_device_links": pd.DataFrame(_pinned_rows(1, 20.0)), "links": LINKS_NV18}
    phases = {"disabled_phase": dis, "enabled_phase": ena, "host_phase": hst}
    monkeypatch.setattr(isolate, "run_isolated", lambda fn, cfg: phases[fn.__name__])
    result = results.Result("transfer", "main", {}, "cuda")
    cfg = stage_settings("transfer")
    _, bar_rows, check_rows = tr._gpu(result, cfg, 2)
    got = {b.bar: b.verdict for b in bar_rows}
    assert got["pinned H2D vs PCIe limit, GPU0"] == "pass"
    assert got["pinned H2D vs PCIe limit, GPU1"] == "fail"  # 20 of 63 GB/s
    assert "host_device_links" in result.tables
    phys = [c for c in check_rows if c.check == "within the physical limit"]
    assert any(c.verdict == "fail" and "p2p enabled ce GPU0->GPU0 67108864" in c.case
               for c in phys)  # the 40 TB/s sweep row
    assert {c.verdict for c in phys if "host<->device" in c.case} == {"pass"}
