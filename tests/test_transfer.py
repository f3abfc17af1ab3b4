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

from gpulab import config as cfgmod
from gpulab import results
from gpulab.report.html import Figures
from gpulab.transfer import bars, full_config, hostmem, matrices, measure, seedref
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
    cfg = full_config({})
    assert cfg["copies"] == 5 and cfg["latency_bytes"] == 16 and cfg["gpus"] == "all"
    with pytest.raises(cfgmod.ConfigError, match=r"key 'matrix_bytes'.*multiple of 16"):
        full_config({"matrix_bytes": 1000})
    with pytest.raises(cfgmod.ConfigError, match=r"key 'p2p_sizes\[1\]'"):
        full_config({"p2p_sizes": [4096, 0]})
    with pytest.raises(cfgmod.ConfigError, match="nonsense"):
        full_config({"nonsense": 1})


@pytest.fixture(scope="module")
def cpu_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("transfer") / "main.h5"
    payload = {"stage": TINY, "devices": {"backend": "cpu", "cpu_devices": 2}}
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "transfer.py"), "--config-json",
                        json.dumps(payload), "--out", str(out)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "GPULAB_HOST": "cpuhost"})
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_cpu_run_writes_matrices_tables_and_not_applicable_records(cpu_result):
    a = results.read_attrs(cpu_result)
    assert a["device_kind"] == "cpu" and a["device_count"] == 2 and "read+write" in a["conventions"]
    assert all(v == "all copies verified" for k, v in a.items() if k.startswith("verify_"))
    c = results.list_contents(cpu_result)
    assert {"p2p", "host_memcpy", "host_threads", "bars", "applicability"} <= set(c["tables"])
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
    assert list(bars_.columns) == bars.BAR_COLUMNS and (bars_["passed"] == "n/a").all()
    ap = results.read_table(cpu_result, "applicability")
    na = ap[~ap["applicable"].astype(bool)]
    assert any("hybrid" in m for m in na["measurement"]) and (na["reason"] != "").all()
    assert results.read_table(cpu_result, "host_memcpy").attrs["units"]["time_s_median"] == "s"


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
                    rows.append({**row, "metric": metric, "mechanism": "ce", "p2p": p2p, "src": s, "dst": d,
                                 "bytes": 160000000, "verified": True})
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
    r.add_table("bars", bars.gpu_bars(p2p_rows, torch_d2d, h2d))
    sweep = pd.DataFrame([{**measure.bandwidth_row([1e-3], 10**6 * k), "mechanism": "ce", "p2p": "enabled",
                           "src": 0, "dst": 1, "bytes": 4096 * k} for k in (1, 4, 16)])
    r.add_table("p2p_sweep", sweep)
    hd = pd.DataFrame([{**measure.bandwidth_row([1e-3], 10**6 * k), "direction": dr, "memory": mem,
                        "call": call, "bytes": 4096 * k} for k in (1, 4) for dr in ("H2D", "D2H")
                       for mem in ("pinned", "pageable") for call in ("async", "blocking")])
    r.add_table("host_device", hd)
    r.add_table("malloc", pd.DataFrame([{"peer_access": pa, "peers": pe, "prior_from": a, "prior_to": b,
                                         "alloc_bytes": 2 << 20, "time_us_median": 10.0 + a}
                                        for pa, pe in (("without", 0), ("with", 1))
                                        for a, b in ((0, 0), (1, 1), (2, 3))]))
    return results.write(r, tmp_path_factory.mktemp("gpu") / "gpu.h5")


def test_gpu_bars_compare_with_torch_in_the_same_run(gpu_result):
    b = results.read_table(gpu_result, "bars")
    same = b[b.bar.str.startswith("same-device copy vs torch")]
    assert len(same) == 4 and (same["threshold"] == 0.95).all()
    np.testing.assert_allclose(same["ratio"], same["measured"] / same["reference"])
    assert set(b["passed"]) <= {"yes", "no"}
    assert b[b.bar.str.startswith("run-to-run spread")]["unit"].eq("(max-min)/median").all()


def test_report_section_renders_cpu_and_gpu_results(cpu_result, gpu_result):
    from gpulab.report.sections import transfer as sec

    gpu = gpu_result
    html = sec.render([cpu_result, gpu], Figures())
    assert html.count("<figure") >= 6 and "Bars on" in html and "Not applicable on cpuhost" in html
    assert "P2P=Disabled isolation" in html and "RTX A5000" in html
    lines = sec.headlines([gpu, cpu_result])
    assert lines[0].startswith("Same-device copy:") and "GB/s (read+write) on NVIDIA H200" in lines[0]
    assert "GPU-GPU P2P" in lines[0] and "Host memcpy" in lines[1]
    ref = sec.references([gpu, cpu_result])
    assert list(ref.columns) == ["metric", "measured", "reference", "source", "fraction"]
    a5000 = ref[ref.metric.str.startswith("GPU-GPU P2P uni")].iloc[0]
    assert a5000["reference"] == pytest.approx((52.71 + 52.9) / 2)
    assert ref.metric.str.contains("known H200 torch D2D").any()
    assert not ref.metric.str.contains("cpuhost").any()  # CPU results have no GPU references
    assert "<p>" in sec.METHODS and "read + write" in sec.METHODS
