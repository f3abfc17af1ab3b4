"""Kernels stage: launch geometry, exactness on CPU, the split over CPU virtual devices, job records."""
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import stage_settings
from gpulab import config as cfgmod
from gpulab import outcomes, results, stages
from gpulab.devices import cpu_devices
from gpulab.kernels import divide, jobs, split
from gpulab.kernels.streams import CpuStream


def covered(n, width, block):
    """Emulate the kernels' index arithmetic: how often each byte is written."""
    g = divide.geometry(n, width, block)
    hits = np.zeros(n, dtype=int)
    i = np.arange(g.blocks * g.block)
    main = i[i < g.nvec]
    for k in range(width):
        np.add.at(hits, main * width + k, 1)
    tail = i[i < n - g.nvec * width]
    np.add.at(hits, g.nvec * width + tail, 1)
    return g, hits


@pytest.mark.parametrize("width", [1, 8, 16])
@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 1000, 4096, 4096 + 13])
def test_geometry_writes_every_byte_exactly_once(width, n):
    g, hits = covered(n, width, 64)
    assert (hits == 1).all()
    assert g.blocks * g.block >= g.threads and (g.blocks - 1) * g.block < g.threads


def test_geometry_rejects_bad_shapes():
    with pytest.raises(ValueError, match=">= 1 byte"):
        divide.geometry(0, 8, 256)
    with pytest.raises(ValueError, match="1, 8 or 16"):
        divide.geometry(10, 4, 256)
    with pytest.raises(ValueError, match="multiple of 32"):
        divide.geometry(10, 8, 100)


@pytest.mark.parametrize("bad", [0, 256, 2.5, True, "3"])
def test_divisor_must_be_an_integer_in_range(bad):
    with pytest.raises(ValueError, match=r"kernels\.divisor"):
        divide.check_divisor(bad)


def test_reference_is_c_unsigned_char_division():
    img = divide.make_image(4096, seed=3)
    assert len(np.unique(img)) > 200  # random bytes, not a constant
    for div in (1, 2, 3, 7, 255):
        ref = divide.reference(img, div)
        assert ref.dtype == np.uint8
        assert [int(x) // div for x in img[:300]] == ref[:300].tolist()


@pytest.mark.parametrize("variant", ["numpy", "torch"])
@pytest.mark.parametrize("n", [1, 17, 65536 + 5])
def test_cpu_variants_match_numpy_exactly(variant, n):
    img = divide.make_image(n, seed=n)
    ref = divide.reference(img, 7)
    out = np.uint8(255) - ref  # differs from the answer everywhere
    inp, o = (img, out) if variant == "numpy" else (torch.from_numpy(img), torch.from_numpy(out))
    divide.divider(variant, o, inp, 7)()
    assert np.array_equal(np.asarray(o), ref)


def test_raw_kernels_refuse_cpu_tensors_and_variants_are_sorted_by_device():
    t = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="CUDA RawKernel"):
        divide.divider("vec8", t, t.clone(), 3)
    assert divide.variants_for("cpu", ["naive", "vec8", "vec16", "numpy", "torch"]) == (
        ["numpy", "torch"], ["naive", "vec8", "vec16"])
    assert divide.variants_for("cuda", ["vec16", "numpy", "torch"]) == (["vec16", "torch"], ["numpy"])
    with pytest.raises(ValueError, match="unknown variant"):
        divide.variants_for("cpu", ["vec32"])


def test_chunks_are_aligned_and_cover_the_image():
    r = split.chunk_ranges(1000, 3)
    assert r[0][0] == 0 and r[-1][1] == 1000
    assert all(a % 16 == 0 for a, _ in r) and all(b == c for (_, b), (c, _) in zip(r, r[1:]))
    with pytest.raises(ValueError, match="too few"):
        split.chunk_ranges(40, 4)


def test_cpu_stream_runs_in_order_and_waits_on_other_streams():
    dev = cpu_devices(1)[0]
    a, b = CpuStream(dev), CpuStream(dev)
    seen = []
    gate = a.record()
    b.wait_event(gate)
    b.submit(lambda: seen.append("b"))
    e0 = a.record()
    a.submit(lambda: seen.append("a1"))
    a.submit(lambda: seen.append("a2"))
    e1 = a.record()
    a.synchronize()
    b.synchronize()
    assert seen.index("a1") < seen.index("a2") and "b" in seen
    assert e0.seconds_until(e1) >= 0
    a.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        a.synchronize()
    a.close()
    b.close()


SMALL = stage_settings("kernels", divisor=5, block=256, kernel="vec16", warmup=1, repeats=2,
                       split={"bytes": 1 << 16, "chunks": 4, "streams": 2, "pinned": [True, False]})


def test_split_over_cpu_devices_is_verified_and_timed_per_phase():
    summary, phases = split.run_split(cpu_devices(2), SMALL)
    # devices {1, 2} x threads {single, per_device} x chunks {1, 4}; no pinned memory on CPU
    assert len(summary) == 8 and summary["verified"].all() and not summary["pinned"].any()
    assert (summary["wall_s_median"] > 0).all() and (summary["gbps"] > 0).all()
    two = phases[phases.devices == 2]
    assert set(two["device"]) == {"cpu:0", "cpu:1"}
    assert set(phases["phase"]) == set(split.PHASES)
    assert (phases["time_s_median"] >= 0).all() and (phases["repeats"] == 2).all()


def test_split_detects_a_wrong_kernel(monkeypatch):
    real = divide.divider

    def off_by_one(variant, out, inp, div, block=256):
        fn = real(variant, out, inp, div, block)

        def call():
            fn()
            np.asarray(out)[0] += 1
        return call

    monkeypatch.setattr(divide, "divider", off_by_one)
    mode = split.Mode(2, "per_device", 1, False)
    img = divide.make_image(4096)
    ref = divide.reference(img, 5)
    _, _, ok = split.run_mode(cpu_devices(2), split._host_buffers(img, False), ref, mode, SMALL)
    assert ok is False


def test_max_concurrency_counts_open_intervals():
    assert jobs.max_concurrency([0, 1, 2], [3, 4, 5]) == 3
    assert jobs.max_concurrency([0, 1], [1, 2]) == 1  # touching, not overlapping
    assert jobs.max_concurrency([0, 10], [5, 15]) == 1


def test_job_checks():
    cpu, na = jobs.job_checks(4, 0, 0, 2)
    assert [c.verdict for c in cpu] == ["not_applicable"] * 2 and all("CPU host" in c.note for c in cpu)
    assert [n.what for n in na] == ["jobs spread over GPUs", "jobs ran concurrently"]
    one = {c.check: c for c in jobs.job_checks(4, 1, 1, 1)[0]}
    assert one["jobs spread over GPUs"].verdict == "pass"
    assert one["jobs ran concurrently"].verdict == "not_applicable"
    two = {c.check: c for c in jobs.job_checks(4, 2, 2, 1)[0]}
    assert two["jobs ran concurrently"].verdict == "fail" and two["jobs ran concurrently"].bound == 2
    spread = {c.check: c for c in jobs.job_checks(4, 2, 1, 2)[0]}  # both jobs on one id
    assert spread["jobs spread over GPUs"].verdict == "fail"


def test_settings_fill_defaults_and_name_bad_keys():
    cfg = stage_settings("kernels", jobs={"count": 2})
    assert cfg.divisor == 3 and cfg.split.chunks == 4 and cfg.jobs.seconds == 1.0
    assert cfg.jobs.count == 2 and cfg.variants
    with pytest.raises(cfgmod.ConfigError, match="divisor"):
        stage_settings("kernels", divisor=0)
    with pytest.raises(cfgmod.ConfigError, match="block"):
        stage_settings("kernels", block=100)


def _stage(tmp_path, variant, cfg, extra=()):
    from gpulab.kernels import extra_args, run
    from gpulab.stage import stage_main

    out = tmp_path / f"{variant}.h5"
    payload = json.dumps({"stage": cfg, "devices": {"backend": "cpu", "cpu_devices": 2}})
    assert stage_main("kernels", run, argv=["--config-json", payload, "--variant", variant,
                                            "--out", str(out), *extra], extra_args=extra_args) == 0
    return out


TINY = {"sizes_bytes": [4096, 65536 + 13], "repeats": 2, "warmup": 1, "batch_bytes": 1 << 16,
        "split": {"bytes": 1 << 16}, "jobs": {"count": 2, "bytes": 4096, "seconds": 0.05}}


@pytest.fixture(scope="module")
def stage_results(tmp_path_factory, monkeypatch_module):
    tmp = tmp_path_factory.mktemp("kernels")
    monkeypatch_module.delenv("GPULAB_DEVICE_IDS", raising=False)
    monkeypatch_module.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch_module.setenv("GPULAB_GPU_POOL", "")
    main = _stage(tmp, "main", TINY)
    job_files = [_stage(tmp, f"job{i}", TINY) for i in range(2)]
    agg = _stage(tmp, "jobs", TINY, ["--jobs", *map(str, job_files)])
    return main, job_files, agg


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_main_result_on_cpu(stage_results):
    main, _, _ = stage_results
    a = results.read_attrs(main)
    assert a["device_kind"] == "cpu" and a["verdict"] == "pass" and "all_verified" not in a
    assert a["variants_not_applicable"] == ["naive", "vec8", "vec16"]
    div = results.read_table(main, "divide")
    assert set(div["variant"]) == {"copy", "numpy", "torch"} and div["verified"].all()
    assert div.attrs["units"]["gbps"].startswith("GB/s") and not div["cache_resident"].any()
    # the host's issue time is recorded; only a GPU row can be launch-bound (the host is the device)
    assert (div["host_issue_s"] > 0).all() and not div["launch_bound"].any()
    assert div.attrs["units"]["host_issue_s"].startswith("s")
    assert div.attrs["units"]["size_bytes"] == outcomes.unit_of("size_bytes")
    assert set(results.list_contents(main)["tables"]) >= set(stages.get("kernels").tables)
    checks = results.read_table(main, "checks")
    assert len(checks) == len(div) + 8 and (checks["verdict"] == "pass").all()  # 8 split modes
    bars = results.read_table(main, "bars").set_index("bar")
    assert list(results.read_table(main, "bars").columns) == outcomes.BAR_COLUMNS
    assert bars.loc["vec16 divide vs same-size copy (largest size)", "verdict"] == "not_applicable"
    assert bars.loc["split over all devices vs one device (speed-up / N)", "measured"] > 0
    assert set(results.read_table(main, "not_applicable")["what"]) >= {"divide variant vec16"}


def test_jobs_on_a_cpu_host_record_no_ids(stage_results):
    _, job_files, agg = stage_results
    a = results.read_attrs(job_files[0])
    assert a["device_ids"] == "" and "no GPU ids" in a["note"] and a["host_gpu_pool"] == []
    assert results.read_table(job_files[0], "checks")["verdict"].tolist() == ["pass"]
    j = results.read_table(agg, "jobs")
    assert list(j["job"]) == [0, 1] and (j["device_ids"] == "").all() and j["verified"].all()
    ch = results.read_table(agg, "checks").set_index("check")
    assert ch.loc["jobs spread over GPUs", "verdict"] == "not_applicable"
    assert results.read_attrs(agg)["verdict"] == "pass"  # the two jobs' outputs, exact
    assert (j["end_s"] > j["start_s"]).all() and (j["start_s"] >= j["launch_s"]).all()
    s = results.read_table(agg, "summary").iloc[0]
    assert s["jobs"] == 2 and s["host_gpus"] == 0 and s["devices_used"] == 0
    assert s["max_kernel_concurrency"] == 1  # run one after the other in this process


@pytest.mark.slow
def test_report_section_renders_cpu_results(stage_results):
    import importlib

    from gpulab.kit.html import Figures

    section = importlib.import_module(stages.get("kernels").section_module())
    assert section.__name__ == "gpulab.kernels.section"

    main, job_files, agg = stage_results
    figs = Figures()
    html = section.render([main, *job_files, agg], figs)
    assert figs.figure_no == 3 and "data:image/png;base64," in html and "Bars" in html
    heads = section.headlines([main, agg])
    assert heads and "GB/s" in heads[0] and "2 independent kernel jobs" in heads[1]
    assert section.references([main]).empty  # no GPU: nothing to compare with datasheet figures
    assert "read" in section.METHODS and "vec16" in section.METHODS


@pytest.mark.gpu
def test_raw_kernels_exact_on_gpu():
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    for n in (1, 15, 17, (1 << 20) + 7):
        img = divide.make_image(n, seed=n)
        ref = divide.reference(img, 3)
        inp = torch.from_numpy(img).cuda()
        for v in ("naive", "vec8", "vec16"):
            out = torch.from_numpy(np.uint8(255) - ref).cuda()
            divide.divider(v, out, inp, 3)()
            torch.cuda.synchronize()
            assert np.array_equal(out.cpu().numpy(), ref), (v, n)
    buf = torch.empty(64, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="aligned"):
        divide.divider("vec16", buf[1:17], buf[32:48], 3)


HOST_PRELUDE = """
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __align__(n) alignas(n)
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct Dim { unsigned x; };
static Dim blockIdx, blockDim, threadIdx;
"""


def test_kernel_source_is_exact_when_run_on_the_host(tmp_path):
    """The RawKernels' own source, compiled for the host and run thread by thread."""
    import shutil
    import subprocess

    from conftest import FIXTURES

    if not shutil.which("g++"):
        pytest.skip("no g++ to compile the kernel source for the host")
    harness = (FIXTURES / "kernels" / "host_harness.cpp").read_text()
    src = tmp_path / "k.cpp"
    src.write_text(HOST_PRELUDE + divide.KERNEL_SOURCE + harness)
    subprocess.run(["g++", "-std=c++11", "-O1", "-Wno-unknown-pragmas", "-o", tmp_path / "k", src],
                   check=True, capture_output=True, text=True)
    for n, div in ((1, 3), (15, 7), (4096 + 13, 3), (100003, 255), (64, 1)):
        p = subprocess.run([tmp_path / "k", str(n), str(div), "64"], capture_output=True, text=True)
        assert p.stdout.split() == ["naive", "0", "vec8", "0", "vec16", "0"], (n, div, p.stdout)


def test_vector_kernels_compile_to_single_8_and_16_byte_loads(tmp_path):
    """nvcc (when present) turns char_vec's int2/int4 casts into one v2/v4 load per thread."""
    import shutil
    import subprocess

    if not shutil.which("nvcc"):
        pytest.skip("no nvcc")
    cu = tmp_path / "k.cu"
    cu.write_text(divide.KERNEL_SOURCE)
    subprocess.run(["nvcc", "-std=c++11", "-arch=sm_90", "--ptx", cu, "-o", tmp_path / "k.ptx"],
                   check=True, capture_output=True, text=True)
    ptx = (tmp_path / "k.ptx").read_text()
    bodies = {name: ptx.split(f".entry {name}(")[1].split(".entry")[0]
              for name in ("divide_vec8", "divide_vec16")}
    assert "ld.global.nc.v2.u32" in bodies["divide_vec8"] and "st.global.v2" in bodies["divide_vec8"]
    assert "ld.global.nc.v4.u32" in bodies["divide_vec16"] and "st.global.v4" in bodies["divide_vec16"]


def _gpu_tables(vec16=3700.0, copy=3800.0, pipelined_wall=0.04, two_dev_wall=0.05, resident=False,
                issue_s=(5e-6,) * 5):
    """Tables shaped like a 2-GPU run (values made up; the arithmetic is checked). ``issue_s``: the
    host's time to queue one call of copy, naive, vec8, vec16, torch."""
    import pandas as pd

    from gpulab.kernels import bench

    gbps = [copy, 2000, 3000, vec16, 3000]
    time_s = [2 * (1 << 30) / (g * 1e9) for g in gbps]
    div = pd.DataFrame({"variant": ["copy", "naive", "vec8", "vec16", "torch"],
                        "size_bytes": [1 << 30] * 5, "gbps": gbps, "time_s_median": time_s,
                        "host_issue_s": list(issue_s),
                        "launch_bound": [bench.launch_bound(i, t) for i, t in zip(issue_s, time_s)],
                        "cache_resident": [resident] * 5})
    rows = []
    for devices, threads, chunks, pinned, wall in [
            (1, "per_device", 1, True, 0.085), (2, "per_device", 1, True, two_dev_wall),
            (2, "single", 1, True, 0.06), (2, "per_device", 8, True, pipelined_wall),
            (2, "per_device", 1, False, 0.2)]:
        rows.append({"devices": devices, "threads": threads, "chunks": chunks, "pinned": pinned,
                     "wall_s_median": wall, "gbps": 1.0 / wall})
    return div, pd.DataFrame(rows)


def test_gpu_bars_from_measured_tables():
    from gpulab.kernels import main_bars

    div, split_df = _gpu_tables()
    bars = main_bars("cuda", "NVIDIA H200", 2, div, split_df).set_index("bar")
    assert bars.loc["vec16 divide vs same-size copy (largest size)", "ratio"] == pytest.approx(3700 / 3800)
    assert bars.loc["vec16 divide vs same-size copy (largest size)", "verdict"] == "pass"
    hbm = bars.loc["same-size copy vs datasheet memory bandwidth"]
    assert hbm["reference"] == 4800 and "H200 SXM" in hbm["source"] and "read+write" in hbm["note"]
    assert hbm["ratio"] == pytest.approx(3800 / 4800) and hbm["verdict"] == "pass"
    assert bars.loc["best divide kernel vs datasheet memory bandwidth", "measured"] == 3700
    assert bars.loc["split over all devices vs one device (speed-up / N)", "measured"] == \
        pytest.approx(1.7)
    assert bars.loc["pipelined (chunked) vs serial copy/compute", "ratio"] == pytest.approx(1.25)
    assert bars.loc["one host thread per device vs one for all", "ratio"] == pytest.approx(1.2)
    assert (bars["source"] != "").all() and set(bars["verdict"]) == {"pass"}
    one = main_bars("cuda", "NVIDIA H200", 1, div, split_df[:1]).set_index("bar")
    assert one.loc["one host thread per device vs one for all", "verdict"] == "not_applicable"
    unknown = main_bars("cuda", "Mystery GPU", 2, div, split_df).set_index("bar")
    assert "limits.yaml" in unknown.loc["same-size copy vs datasheet memory bandwidth", "note"]
    no_raw = main_bars("cuda", "NVIDIA H200", 2, div[div.variant.isin(["copy", "torch"])], split_df)
    assert (no_raw.set_index("bar").loc[["vec16 vs torch.floor_divide",
                                         "best divide kernel vs datasheet memory bandwidth"], "verdict"]
            == "not_applicable").all()  # a variant left out of the config is not a failure
    cached = main_bars("cuda", "NVIDIA H200", 2, *_gpu_tables(resident=True)).set_index("bar")
    assert cached.loc["same-size copy vs datasheet memory bandwidth", "verdict"] == "not_applicable"


@pytest.mark.parametrize("bar, degraded", [
    ("vec16 divide vs same-size copy (largest size)", dict(vec16=2000.0)),
    ("vec16 vs torch.floor_divide", dict(vec16=2000.0)),
    ("same-size copy vs datasheet memory bandwidth", dict(copy=1900.0)),  # e.g. HBM clocks throttled
    ("best divide kernel vs datasheet memory bandwidth", dict(vec16=1900.0)),
    ("pipelined (chunked) vs serial copy/compute", dict(pipelined_wall=0.07)),
    ("split over all devices vs one device (speed-up / N)", dict(two_dev_wall=0.07)),
])
def test_every_kernels_bar_fails_on_a_degraded_measurement(bar, degraded):
    from gpulab.kernels import main_bars

    assert main_bars("cuda", "NVIDIA H200", 2, *_gpu_tables()).set_index("bar").loc[bar, "verdict"] == "pass"
    got = main_bars("cuda", "NVIDIA H200", 2, *_gpu_tables(**degraded)).set_index("bar").loc[bar]
    assert got["verdict"] == "fail", got


def test_launch_bound_rows_make_their_bars_not_applicable_and_gpu_bound_ones_still_fail():
    # An H100 at the quick preset's 4 MB read vec16 at 0.78 x torch.floor_divide: ~30 us per call,
    # host-issue time, for ~2 us of memory traffic (docs/runs/2026-12-06-quick-h100).
    from gpulab.kernels import bench, main_bars

    assert bench.launch_bound(25e-6, 30e-6) and not bench.launch_bound(5e-6, 300e-6)
    # on a GPU a sample is never one call: its event pair would time the launch latency too
    assert bench.inner_calls(4194317, 4 << 20, bench.CUDA_MIN_CALLS) == bench.CUDA_MIN_CALLS > 1
    assert bench.inner_calls(1 << 20, 4 << 20) == 4 and bench.inner_calls(1 << 30, 4 << 20) == 1
    assert not bench.launch_bound(1.0, 0.0)
    div, split_df = _gpu_tables()
    small = div.assign(size_bytes=4194317, time_s_median=32e-6, host_issue_s=28e-6,
                       gbps=div.variant.map({"copy": 260.0, "naive": 250.0, "vec8": 262.0,
                                             "vec16": 263.0, "torch": 338.0}))
    small["launch_bound"] = True
    bars = main_bars("cuda", "NVIDIA H200", 2, small, split_df).set_index("bar")
    for bar in ("vec16 divide vs same-size copy (largest size)", "vec8 (seed char_vec) vs naive divide",
                "vec16 vs torch.floor_divide", "same-size copy vs datasheet memory bandwidth",
                "best divide kernel vs datasheet memory bandwidth"):
        assert bars.loc[bar, "verdict"] == "not_applicable", bar
        assert "launch-bound" in bars.loc[bar, "note"] and "kernels.sizes_bytes" in bars.loc[bar, "note"]
    assert bars.loc["vec16 vs torch.floor_divide", "measured"] == 263.0
    # one launch-bound side is enough: the other side's figure is compared with the host's rate
    torch_only = main_bars("cuda", "NVIDIA H200", 2, *_gpu_tables(
        vec16=2000.0, issue_s=(5e-6, 5e-6, 5e-6, 5e-6, 1.0))).set_index("bar")
    assert torch_only.loc["vec16 vs torch.floor_divide", "verdict"] == "not_applicable"
    assert torch_only.loc["vec16 divide vs same-size copy (largest size)", "verdict"] == "fail"
    # a slow kernel that keeps the GPU busy is still a failure, not excused as launch-bound
    slow = main_bars("cuda", "NVIDIA H200", 2, *_gpu_tables(vec16=2000.0)).set_index("bar")
    assert slow.loc["vec16 vs torch.floor_divide", "verdict"] == "fail"


def test_vec8_and_host_thread_bars_fail_when_slower():
    import pandas as pd

    from gpulab.kernels import bars as kbars

    div, split_df = _gpu_tables()
    slow_vec8 = div.assign(gbps=div.gbps.where(div.variant != "vec8", 1500.0))
    got = {b.bar: b for b in kbars.divide_bars("cuda", "NVIDIA H200", slow_vec8)}
    assert got["vec8 (seed char_vec) vs naive divide"].verdict == "fail"
    per_dev_slow = split_df.copy()
    per_dev_slow.loc[(per_dev_slow.devices == 2) & (per_dev_slow.threads == "per_device")
                     & (per_dev_slow.chunks == 1) & per_dev_slow.pinned, "gbps"] = 1 / 0.09
    got = {b.bar: b for b in kbars.split_bars("cuda", 2, pd.DataFrame(per_dev_slow))}
    assert got["one host thread per device vs one for all"].verdict == "fail"


def test_multiply_shift_division_is_exact_for_every_byte_and_divisor():
    # The vector kernels divide by x * ceil(2^16 / d) >> 16; check it against // exhaustively.
    x = np.arange(256, dtype=np.uint32)[:, None]
    d = np.arange(1, 256, dtype=np.uint32)[None, :]
    magic = (65536 + d - 1) // d
    assert np.array_equal((x * magic) >> 16, x // d)


def test_a5000_reference_compares_read_write_with_read_write(tmp_path):
    # issue 24: the seed's A5000 diagonal (675.82 GB/s) counts read+write, as the copy's gbps
    # does; halving ours made an H200 copy read 2.9x the A5000 instead of 5.9x.
    from gpulab.kernels import section

    r = results.Result("kernels", "main", {}, "cuda")
    r.add_table(outcomes.BARS, outcomes.bars_frame([]))
    r.add_table("divide", pd.DataFrame([{"variant": "copy", "size_bytes": 1 << 30, "gbps": 4000.0}]))
    path = results.write(r, tmp_path / "k.h5")
    ref = section.references([path])
    row = ref[ref["metric"].str.contains("same-device copy")].iloc[0]
    assert row["measured"] == 4000.0 and row["fraction"] == pytest.approx(4000.0 / 675.82)
    assert "read+write" in row["metric"]


def test_kernel_rows_above_the_memory_bandwidth_fail_the_physical_limit():
    # issue 24: a divide or copy figure above 1.05 x the datasheet memory bandwidth is a failed
    # check and fails its datasheet bar; L2-resident rows are not compared.
    from gpulab.kernels import bars as kbars

    div, split_df = _gpu_tables(copy=9000.0)  # 9 TB/s read+write on an H200 (4.8 TB/s)
    got, checks = kbars.physical_checks("cuda", "NVIDIA H200", div, kbars.divide_bars(
        "cuda", "NVIDIA H200", div))
    copy_bar = [b for b in got if b.bar.startswith("same-size copy vs datasheet")][0]
    assert copy_bar.verdict == "fail" and "exceeds the physical limit" in copy_bar.note
    by_case = {c.case: c.verdict for c in checks if c.case.startswith("divide")}
    assert by_case["divide copy, 1073741824 B (read+write)"] == "fail"
    assert by_case["divide vec16, 1073741824 B (read+write)"] == "pass"
    ok_div, _ = _gpu_tables()
    assert {c.verdict for c in kbars.physical_checks("cuda", "NVIDIA H200", ok_div, [])[1]} == {"pass"}
    cached, _ = _gpu_tables(copy=9000.0, resident=True)
    assert kbars.physical_checks("cuda", "NVIDIA H200", cached, [])[1] == []
    assert kbars.physical_checks("cpu", "cpu", div, []) == ([], [])


@pytest.mark.slow
def test_a_kernel_job_imports_no_torch_and_records_its_start_up(tmp_path):
    """Issue 28: an independent job's work is ~0.5 s; importing torch (not used by a numpy or CuPy
    kernel) was most of its wall time. The job runs in a fresh interpreter, as Snakemake starts it,
    and records interpreter start to first timed call."""
    import subprocess
    import sys

    out = tmp_path / "job0.h5"
    payload = json.dumps({"stage": TINY, "devices": {"backend": "cpu", "cpu_devices": 2}})
    code = ("import sys, runpy; sys.argv = ['scripts/kernels.py', '--config-json', sys.argv[1], "
            "'--variant', 'job0', '--out', sys.argv[2]]\n"
            "try:\n    runpy.run_path('scripts/kernels.py', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "heavy = sorted(m for m in ('torch', 'matplotlib', 'cupy') if m in sys.modules)\n"
            "print('HEAVY', heavy)\n")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "CUDA_VISIBLE_DEVICES": "",
           "GPULAB_GPU_POOL": ""}
    p = subprocess.run([sys.executable, "-c", code, payload, str(out)], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "HEAVY []" in p.stdout, p.stdout
    a = results.read_attrs(out)
    job = results.read_table(out, "job").iloc[0]
    assert 0 < a["startup_s"] < 60 and a["startup_s"] == pytest.approx(job["startup_s"])
    assert job["launch_unix"] + job["startup_s"] >= job["start_unix"]
    assert job["verified"] and job["kernel"] == "numpy"
    assert results.read_table(out, "job").attrs["units"]["startup_s"].startswith("s")


class _FakeCupy:
    """CuPy faked at its boundary (no GPU here): one device, arrays over numpy, a RawKernel that
    divides like the CUDA source, CUDA events over the host clock."""

    def __init__(self):
        import time as _time
        import types

        fake = self

        class Arr:
            def __init__(self, a):
                self.a = np.array(a)
                self.size = self.a.size

            def get(self):
                return self.a.copy()

        class Dev:
            def __init__(self, i):
                fake.devices_used.add(i)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class Event:
            def record(self):
                self.t = _time.perf_counter()

            def synchronize(self):
                pass

        def raw_kernel(source, name):
            assert "divide_vec16" in source and name.startswith("divide_")

            def launch(grid, block, args):
                inp, out, n, div = args
                fake.launches += 1
                out.a[:int(n)] = inp.a[:int(n)] // np.uint8(div)
            return launch

        self.devices_used, self.launches = set(), 0
        stream = types.SimpleNamespace(synchronize=lambda: None)
        runtime = types.SimpleNamespace(
            getDeviceCount=lambda: 1,
            getDeviceProperties=lambda i: {"name": b"Fake GPU", "totalGlobalMem": 1 << 30})
        self.cuda = types.SimpleNamespace(
            runtime=runtime, Device=Dev, Event=Event, get_current_stream=lambda: stream,
            get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)
        self.asarray = Arr
        self.RawKernel = raw_kernel


def test_a_kernel_job_on_a_cuda_host_runs_the_rawkernel_through_cupy_alone(tmp_path, monkeypatch):
    import sys

    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(divide, "_KERNELS", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("GPULAB_GPU_POOL", "0,1,2,3")
    from gpulab.kernels import extra_args, run
    from gpulab.stage import stage_main

    out = tmp_path / "job0.h5"
    payload = json.dumps({"stage": {**TINY, "kernel": "vec16"},
                          "devices": {"backend": "cuda", "cpu_devices": 2}})
    assert stage_main("kernels", run, argv=["--config-json", payload, "--variant", "job0",
                                            "--out", str(out)], extra_args=extra_args) == 0
    job = results.read_table(out, "job").iloc[0]
    assert results.read_attrs(out)["device_kind"] == "cuda"
    assert job["kernel"] == "vec16" and job["verified"] and job["device_name"] == "Fake GPU"
    assert job["device"] == "cuda:0" and job["cuda_visible_devices"] == "3"
    assert fake.launches >= job["calls"] and job["startup_s"] > 0
