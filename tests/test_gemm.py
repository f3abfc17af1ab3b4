"""gemm stage: layout arithmetic, the error check, the algorithms on gloo ranks, the stage, the report."""
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import REPO
from gpulab import config, launch, outcomes, plausible, results
from gpulab.gemm import layout, numerics, runner, scaling
from gpulab.gemm import single as single_mod
from gpulab.stage import stage_main

GEMM_SCHEMA = "gemm"  # the packaged schema, by stage name


@pytest.mark.parametrize("p, shape", [(1, (1, 1)), (2, (1, 2)), (3, (1, 3)), (4, (2, 2)),
                                      (6, (2, 3)), (7, (1, 7)), (8, (2, 4)), (12, (3, 4))])
def test_grid_is_the_most_square_factorisation(p, shape):
    assert layout.grid_shape(p) == shape


@pytest.mark.parametrize("m, n, k, p, panels", [(64, 64, 64, 4, 4), (37, 29, 41, 6, 5),
                                                (10, 7, 3, 8, 1), (100, 50, 1000, 2, 3)])
def test_every_summa_panel_has_one_owner_and_padding_covers_the_matrix(m, n, k, p, panels):
    pl = layout.summa_plan(m, n, k, p, panels)
    assert pl.panels % math.lcm(pl.rows, pl.cols) == 0 and pl.panels * pl.w == pl.k_pad >= k
    assert pl.mb * pl.rows >= m and pl.nb * pl.cols >= n
    for panel in range(pl.panels):
        ja, off_a = pl.a_owner(panel)
        ib, off_b = pl.b_owner(panel)
        assert ja < pl.cols and off_a + pl.w <= pl.kb_a  # inside one block column of A
        assert ib < pl.rows and off_b + pl.w <= pl.kb_b  # inside one block row of B
        assert ja * pl.kb_a + off_a == ib * pl.kb_b + off_b == panel * pl.w
    rp = layout.RowPlan(m, n, k, p)
    assert rp.m_pad == rp.mb * p >= m > rp.m_pad - p


def test_error_check_catches_a_wrong_block_and_rejects_zero_data():
    a, b = numerics.random_inputs(48, 40, 56, seed=3, device=torch.device("cpu"))
    ref = a.double() @ b.double()
    good = a @ b
    rel = numerics.relative_error(*numerics.error_terms(good, ref))
    assert 0 < rel < numerics.precision("fp32").bound
    bad = good.clone()
    bad[:24, :20] = 0  # one block of C missing, as a broken SUMMA step would leave it
    assert numerics.relative_error(*numerics.error_terms(bad, ref)) > 0.3
    with pytest.raises(ValueError, match="zero norm"):
        numerics.relative_error(1.0, 0.0)


def test_precisions_name_what_is_unknown_or_unsupported():
    with pytest.raises(ValueError, match="unknown precision 'fp64'"):
        numerics.precision("fp64")
    assert "CUDA" in numerics.unsupported_reason(numerics.precision("tf32"), torch.device("cpu"))
    assert numerics.unsupported_reason(numerics.precision("fp32"), torch.device("cpu")) is None


def test_matmul_mode_turns_tf32_on_only_inside_and_restores():
    before = torch.get_float32_matmul_precision()
    with numerics.matmul_mode(numerics.precision("tf32")):
        assert torch.get_float32_matmul_precision() == "high"
    with numerics.matmul_mode(numerics.precision("fp32")):
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.slow
def test_four_gloo_ranks_run_every_algorithm_on_every_grid_and_verify():
    payload = {"backend": "gloo", "transport": "gloo", "sizes": [[37, 29, 41], [64, 48, 80]],
               "dtypes": ["fp32", "bf16"], "algorithms": ["row1d", "summa", "summa_overlap"],
               "ranks": [1, 2, 4], "summa_panels": 3, "warmup": 0, "repeats": 2, "seed": 5,
               "threads": 1}
    out = launch.run_workers("gpulab.gemm.worker", payload, nproc=4, env={"OMP_NUM_THREADS": "1"})
    rows = pd.DataFrame(out[0]["rows"])
    assert [o["rows"] for o in out[1:]] == [[], [], []]
    assert len(rows) == 2 * 2 * 3 * 3
    summa = rows[rows["algorithm"] != "row1d"]
    assert dict(zip(summa["P"], summa["grid"])) == {1: "1x1", 2: "1x2", 4: "2x2"}
    assert set(summa[summa["P"] == 4]["panels"]) == {4}  # 3 rounded up to a multiple of lcm(2, 2)
    assert (rows["rel_error"] <= rows["bound"]).all(), rows[["algorithm", "P", "dtype", "rel_error", "bound"]]
    assert (rows["rel_error"] > 0).all()  # real arithmetic, not a copied reference
    assert (rows["time_s_median"] > 0).all() and (rows["compute_s"] <= rows["time_s_median"]).all()


def test_scaling_uses_the_single_device_baseline_and_marks_missing_p():
    single = pd.DataFrame([{"M": 8, "N": 8, "K": 8, "dtype": "fp32", "time_s_median": 4.0}])
    multi = pd.DataFrame([
        {"transport": "nccl", "algorithm": "summa", "M": 8, "N": 8, "K": 8, "dtype": "fp32",
         "P": p, "time_s_median": t, "tflops_median": 1.0} for p, t in ((1, 5.0), (2, 2.5))])
    t = scaling.table(single, multi).set_index("P")
    assert t.loc[2, "speedup"] == pytest.approx(1.6) and t.loc[2, "efficiency"] == pytest.approx(0.8)
    assert t.loc[2, "efficiency_vs_p1"] == pytest.approx(1.0)
    # A P not measured is no table row (no free-text status to parse back) ...
    assert list(t.index) == [1, 2] and "status" not in t.columns
    # ... but a not_applicable row with its reason where a launch gave none (P=4 > 2 devices is
    # the runner's own row, "2 cpu device(s) in this job")
    assert scaling.unmeasured(multi, [1, 2], 2) == []
    [gone] = scaling.unmeasured(multi[multi["P"] == 1], [1, 2], 2)
    assert gone.what == "strong scaling nccl summa P=2" and gone.reason.startswith("not run")


def test_schema_fills_defaults_and_names_bad_keys():
    cfg = config.validate({}, GEMM_SCHEMA)
    assert cfg["dtypes"] == ["fp32", "tf32", "bf16"] and cfg["bar_size"] == 8192
    with pytest.raises(config.ConfigError, match=r"key 'dtypes\[0\]'.*fp64"):
        config.validate({"dtypes": ["fp64"]}, GEMM_SCHEMA)
    with pytest.raises(config.ConfigError, match=r"key 'sizes\[0\]'"):
        config.validate({"sizes": [[64, 64]]}, GEMM_SCHEMA)
    with pytest.raises(config.ConfigError, match=r"key 'sizes\[0\]\[1\]'.*minimum"):
        config.validate({"sizes": [[8, 0, 8]]}, GEMM_SCHEMA)


@pytest.fixture(scope="module")
def stage_result(tmp_path_factory) -> Path:
    """The stage end to end on 2 CPU virtual devices (P=3 asked for: not applicable)."""
    out = tmp_path_factory.mktemp("gemm") / "main.h5"
    stage = config.validate({"sizes": [[96, 64, 80]], "ranks": [1, 2, 3], "warmup": 0,
                             "repeats": 2, "summa_panels": 2}, GEMM_SCHEMA)
    import json

    payload = json.dumps({"stage": stage, "devices": {"backend": "cpu", "cpu_devices": 2}})
    assert stage_main("gemm", runner.run, argv=["--config-json", payload, "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_stage_records_measurements_checks_and_what_is_not_applicable(stage_result):
    a = results.read_attrs(stage_result)
    assert a["device_kind"] == "cpu" and a["verdict"] == "pass"
    assert not {"all_checks_passed", "checks_passed", "checks_total", "verified"} & set(a)
    checks = results.read_table(stage_result, "checks")
    assert len(checks) == 2 + 2 * 2 * 3 and set(checks["verdict"]) == {"pass"}
    assert a["verdict_summary"].split(": ", 1)[1].startswith("14 of 14 checks passed")  # after the judged count
    single = results.read_table(stage_result, "single")
    assert list(single["dtype"]) == ["fp32", "bf16"] and single.attrs["units"]["tflops_median"] == "TFLOP/s"
    multi = results.read_table(stage_result, "multi")
    assert set(multi["P"]) == {1, 2} and set(multi["transport"]) == {"gloo"}
    assert (multi["rel_error"] <= multi["bound"]).all()
    scal = results.read_table(stage_result, "scaling")
    assert 3 not in set(scal["P"]) and "status" not in scal.columns
    na = results.read_table(stage_result, "not_applicable")
    assert "P=3" in set(na["what"]), na
    bars = results.read_table(stage_result, "bars")
    assert list(bars.columns) == outcomes.BAR_COLUMNS
    # On CPU devices neither bar can be judged: not applicable, with the reason, never "failed".
    assert set(bars["verdict"]) == {"not_applicable"} and bars["note"].str.len().gt(10).all()
    assert any("datasheet" in n for n in bars["note"])
    assert any("share the host's cores" in n for n in bars["note"])
    na = results.read_table(stage_result, "not_applicable").set_index("what")
    assert "CUDA only" in na.loc[single_mod.HARNESS_CHECK, "reason"]
    assert "tf32" in na.loc["dtype tf32", "reason"] and "P=3" in na.index
    assert na.loc["NCCL P2P disabled", "reason"] == "needs CUDA GPUs (NCCL)"


def test_peak_bar_fails_below_its_share_of_the_datasheet_peak():
    good = single_mod.peak_bar("bf16", 8192, 700.0, "NVIDIA H200")
    assert good.verdict == "pass" and good.reference == 989.5 and "H200 SXM" in good.source
    slow = single_mod.peak_bar("bf16", 8192, 700.0 / 3, "NVIDIA H200")  # a throttled clock
    assert slow.verdict == "fail" and slow.ratio < single_mod.PEAK_THRESHOLD
    unknown = single_mod.peak_bar("bf16", 8192, 50.0, "NVIDIA Imaginary 9000")
    assert unknown.verdict == "not_applicable" and "no datasheet" in unknown.note
    assert unknown.measured == 50.0


def test_harness_check_is_a_check_and_fails_on_an_injected_delay():
    assert single_mod.harness_verdict("bf16 8192^3", 1.01).verdict == "pass"
    slow = single_mod.harness_verdict("bf16 8192^3", 1.10)  # 10% added to every call
    assert slow.verdict == "fail" and slow.value == pytest.approx(0.10)
    assert slow.check.startswith("harness overhead")


def _scaling(speedup_at_4: float) -> pd.DataFrame:
    single = pd.DataFrame([{"M": 64, "N": 64, "K": 64, "dtype": "bf16", "time_s_median": 4.0}])
    multi = pd.DataFrame([
        {"transport": "nccl", "algorithm": alg, "M": 64, "N": 64, "K": 64, "dtype": "bf16",
         "P": p, "time_s_median": 4.0 / s, "tflops_median": 1.0}
        for alg, k in (("row1d", 0.5), ("summa", 1.0))
        for p, s in ((1, 1.0), (4, speedup_at_4 * k))])
    return scaling.table(single, multi)


def test_multi_device_bar_is_speedup_against_one_device_and_fails_when_slow():
    [bar] = scaling.bars(_scaling(3.6), "cuda", 4)
    assert bar.verdict == "pass" and bar.measured == pytest.approx(3.6) and bar.reference == 4
    assert bar.ratio == pytest.approx(0.9) and "summa" in bar.note and "one device" in bar.source
    [slow] = scaling.bars(_scaling(1.2), "cuda", 4)  # extra devices that barely help
    assert slow.verdict == "fail" and slow.ratio == pytest.approx(0.3)
    [cpu] = scaling.bars(_scaling(3.6), "cpu", 4)
    assert cpu.verdict == "not_applicable"
    [one] = scaling.bars(_scaling(3.6), "cuda", 1)
    assert one.verdict == "not_applicable" and "1 here" in one.note


def test_a_crashed_launch_is_a_failed_check_and_fails_the_stage(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise launch.LaunchError("rank 1 exited with signal 9")

    monkeypatch.setattr(runner, "run_multi", crash)
    stage = config.validate({"sizes": [[16, 16, 16]], "dtypes": ["fp32"], "ranks": [1, 2],
                             "warmup": 0, "repeats": 1}, GEMM_SCHEMA)
    import json

    out = tmp_path / "crash.h5"
    payload = json.dumps({"stage": stage, "devices": {"backend": "cpu", "cpu_devices": 2}})
    assert stage_main("gemm", runner.run, argv=["--config-json", payload, "--out", str(out)]) == 0
    a = results.read_attrs(out)
    assert a["verdict"] == "fail" and "1 crashed" in a["verdict_summary"]
    checks = results.read_table(out, "checks")
    assert "signal 9" in checks[checks["check"] == "ran"]["note"].iloc[0]


def test_empty_ranks_measure_the_single_device_only_without_a_launch(tmp_path, monkeypatch):
    """The health preset's GEMM: one per dtype on one device, no torchrun start."""
    def no_launch(*args, **kwargs):
        raise AssertionError("gemm.ranks is empty: nothing may be launched")

    monkeypatch.setattr(runner, "run_multi", no_launch)
    stage = config.validate({"sizes": [[32, 24, 16]], "dtypes": ["fp32", "bf16"], "ranks": [],
                             "warmup": 0, "repeats": 2}, GEMM_SCHEMA)
    import json

    out = tmp_path / "single.h5"
    payload = json.dumps({"stage": stage, "devices": {"backend": "cpu", "cpu_devices": 2}})
    assert stage_main("gemm", runner.run, argv=["--config-json", payload, "--out", str(out)]) == 0
    a = results.read_attrs(out)
    assert a["verdict"] == "pass" and a["world_size"] == 1
    assert list(results.read_table(out, "single")["dtype"]) == ["fp32", "bf16"]
    na = results.read_table(out, "not_applicable").set_index("what")
    assert "single-device baseline only" in na.loc["multi-device GEMM", "reason"]
    assert na.loc["NCCL P2P disabled", "reason"] == "gemm.ranks is empty"


@pytest.mark.slow
def test_gemm_honours_devices_nodes_on_two_loopback_nodes(tmp_path):
    """Two torchrun agents as two nodes of one CPU rank each: P=2 spans both nodes."""
    import threading

    from gpulab.stage import StageContext

    stage = config.validate({"sizes": [[24, 16, 20]], "dtypes": ["fp32"], "ranks": [1, 2],
                             "algorithms": ["row1d", "summa"], "warmup": 0, "repeats": 1},
                            GEMM_SCHEMA)
    port = launch.free_port()
    outs, errors = {}, []

    def node(rank: int):
        try:
            nodes = {"nnodes": 2, "node_rank": rank, "master_addr": "127.0.0.1", "master_port": port}
            ctx = StageContext("gemm", "main", dict(stage),
                               {"backend": "cpu", "cpu_devices": 1, "nodes": nodes},
                               tmp_path / f"node{rank}.h5")
            outs[rank] = results.write(runner.run(ctx), ctx.out)
        except launch.NotResultNode:  # node 1: node 0 holds every rank's rows and alone writes
            outs[rank] = None
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(320)
    assert not errors, errors
    a0 = results.read_attrs(outs[0])
    assert (a0["world_size"], a0["nnodes"]) == (2, 2) and outs[1] is None
    multi = results.read_table(outs[0], "multi")
    assert set(multi["P"]) == {1, 2} and (multi["rel_error"] <= multi["bound"]).all()
    assert a0["verdict"] == "pass"
    assert set(results.read_table(outs[0], "placement")["node_rank"]) == {0, 1}


@pytest.mark.slow
def test_report_section_renders_figures_tables_and_headlines(stage_result):
    from gpulab.kit.html import Figures
    from gpulab.gemm import section

    figs = Figures()
    html = section.render([stage_result], figs)
    assert figs.figure_no == 3 and figs.table_no >= 4 and "14 of 14 GEMM checks verified" in html
    heads = section.headlines([stage_result])
    assert 1 <= len(heads) <= 3 and "TFLOP/s" in heads[0]
    assert "2*M*N*K" in section.METHODS.replace("&middot;", "*") or "2MNK" in section.METHODS
    refs = section.references([stage_result])  # no H200 here: no reference rows
    assert list(refs.columns) == ["metric", "measured", "reference", "source", "fraction"]


def test_harness_check_times_both_sides_in_batches_with_one_timer(monkeypatch):
    # issue 24: gpulab's call path was timed one call per CUDA-event pair (launch gap included)
    # while the raw side was timed in batches of 10; both sides now go through timing.measure
    # with the same batch, so the check sees only the difference of the two calls.
    seen = []
    real = single_mod.timing.measure

    def spy(fn, **kw):
        seen.append(kw.get("batch", 1))
        return real(fn, **kw)

    monkeypatch.setattr(single_mod.timing, "measure", spy)
    check = single_mod.harness_check(torch.device("cpu"), 16, warmup=0, repeats=2, seed=0)
    # Batches on a GPU (the launch gap); one call per sample on the CPU, where a call is the work
    # itself (batches of 10 2048^3 bf16 CPU calls kept the CPU health preset busy for minutes).
    assert single_mod.calls_per_sample(torch.device("cuda", 0)) == single_mod.HARNESS_BATCH > 1
    cpu_batch = single_mod.calls_per_sample(torch.device("cpu"))
    assert cpu_batch == 1
    # one warm-up batch per side, then 4 batches per ABBA block, at least HARNESS_BLOCKS blocks
    assert seen == [cpu_batch] * (2 + 4 * single_mod.HARNESS_BLOCKS)
    assert check.note.startswith(f"median over {single_mod.HARNESS_BLOCKS} ABBA blocks")
    assert check.check == single_mod.HARNESS_CHECK and check.bound == single_mod.HARNESS_BOUND
    monkeypatch.setattr(single_mod, "calls_per_sample", lambda d: single_mod.HARNESS_BATCH)
    rows = single_mod.baseline(torch.device("cpu"), [(8, 8, 8)], [numerics.precision("fp32")],
                               0, 1, 0)
    assert seen[-1] == single_mod.HARNESS_BATCH and rows[0]["repeats"] == 1


def test_multi_device_bar_judges_a_fixed_algorithm_and_a_failed_fp64_check_fails_it():
    # issue 24: the bar took the fastest algorithm of those run; it now judges summa whichever
    # is faster, and a summa run whose output failed its error check cannot pass.
    single = pd.DataFrame([{"M": 64, "N": 64, "K": 64, "dtype": "bf16", "time_s_median": 4.0}])

    def multi(summa_speedup, summa_err=1e-3):
        return pd.DataFrame([
            {"transport": "nccl", "algorithm": alg, "M": 64, "N": 64, "K": 64, "dtype": "bf16",
             "P": p, "time_s_median": 4.0 / s, "tflops_median": 1.0,
             "rel_error": err if p > 1 else 1e-3, "bound": 1e-2}
            for alg, s4, err in (("row1d", 3.9, 1e-3), ("summa", summa_speedup, summa_err))
            for p, s in ((1, 1.0), (4, s4))])

    [bar] = scaling.bars(scaling.table(single, multi(1.0)), "cuda", 4, [1, 4])
    assert "summa" in bar.bar and bar.verdict == "fail" and bar.measured == pytest.approx(1.0)
    [wrong] = scaling.bars(scaling.table(single, multi(3.8, 0.5)), "cuda", 4, [1, 4])
    assert wrong.verdict == "fail" and "error check" in wrong.note
    [none] = scaling.bars(pd.DataFrame(), "cuda", 1, [])  # gemm.ranks: [] on an 8-GPU node
    assert none.verdict == "not_applicable" and "gemm.ranks" in none.note
    assert "1 here" not in none.note


def test_gemm_tflops_above_the_dense_peak_fail_the_plausibility_check():
    rows = [{"M": 8192, "N": 8192, "K": 8192, "dtype": "bf16", "tflops_median": tf}
            for tf in (700.0, 1100.0)]  # H200 SXM bf16 dense peak: 989.5
    multi = [{**rows[0], "algorithm": "summa", "P": 2, "transport": "nccl", "tflops_median": 1500.0}]
    got = single_mod.plausibility_checks(rows, multi, "NVIDIA H200")
    assert [c.verdict for c in got] == ["pass", "fail", "pass"]  # 1500 < 2 x 989.5
    assert "exceeds the physical limit" in got[1].note
    assert single_mod.plausibility_checks(rows, [], "Mystery GPU") == []
    [bar] = plausible.guard_all([single_mod.peak_bar("bf16", 8192, 1100.0, "NVIDIA H200")])[0]
    assert bar.verdict == "fail" and "exceeds the physical limit" in bar.note


def test_gemm_headlines_report_the_fixed_configuration_not_the_best(tmp_path):
    # issue 24: the headline showed the bar with the highest ratio; it now shows the bf16 peak
    # bar (the fixed precision) even when fp32's ratio is higher, and names a failed bar.
    from gpulab.gemm import section

    r = results.Result("gemm", "main", {}, "cuda")
    r.add_table("single", pd.DataFrame([
        {"M": 8192, "N": 8192, "K": 8192, "dtype": d, "tflops_median": t}
        for d, t in (("fp32", 60.0), ("bf16", 500.0), ("fp16", 900.0))]))
    r.add_table("bars", outcomes.bars_frame([
        single_mod.peak_bar("fp32", 8192, 60.0, "NVIDIA H200"),  # 0.90: the best ratio
        single_mod.peak_bar("bf16", 8192, 500.0, "NVIDIA H200"),  # 0.51: fails
        single_mod.peak_bar("fp16", 8192, 900.0, "NVIDIA H200")]))
    r.add_table("checks", outcomes.checks_frame([outcomes.Check.of("c", "x", True)]))
    path = results.write(r, tmp_path / "g.h5")
    heads = section.headlines([path])
    assert "bf16 8192x8192x8192: 500 TFLOP/s" in heads[0]
    assert "bf16" in heads[1] and ": fail" in heads[1] and "Failed bars: 1 of 3" in heads[1]


def test_harness_check_blocks_cancel_a_drifting_clock_and_a_clock_step_where_rounds_read_a_false_fail(
        monkeypatch):
    """Both sides cost the same; every timed batch is 2 % slower than the one before (a GPU
    settling from burst to sustained clocks), and one batch in the middle lands on a 30 % clock
    dip. ABBA blocks with the median over blocks read no overhead; path-first pairs read the path
    ~2 % faster per block and, timed as the old 3 rounds of the preset's 3 repeats per side, 5 %:
    a fail of the two-sided bound on a healthy GPU, as an H100 read -4.8 % and -3.5 % at the quick
    preset (docs/runs/2026-12-06-forkrun, docs/runs/2026-12-06-harness). An added 10 % per path
    call still fails the bound."""
    from types import SimpleNamespace

    clock = {"t": 0}

    def drifting(repeats, extra=1.0):
        out = []
        for _ in range(repeats):
            t = clock["t"]
            out.append(1e-3 * (1 + 0.02 * t) * (1.3 if t == 21 else 1.0) * extra)
            clock["t"] += 1
        return out

    def run(order=None, path_cost=1.0):
        clock["t"] = 0
        monkeypatch.setattr(single_mod, "time_path", lambda a, b, out, d, w, r: SimpleNamespace(
            samples=drifting(r, path_cost)))
        monkeypatch.setattr(single_mod, "_plain_matmul_seconds", lambda a, b, d, w, r: drifting(r))
        if order:
            monkeypatch.setattr(single_mod, "harness_order", order)
        return single_mod.harness_check(torch.device("cpu"), 16, warmup=0, repeats=3, seed=0)

    check = run()
    assert check.verdict == "pass" and abs(check.value) < 1e-3, check
    assert single_mod.harness_order(1) == [("path", "plain", "plain", "path")]
    assert run(path_cost=1.10).verdict == "fail"
    pairs = run(lambda n: [("path", "plain")] * n)
    assert pairs.value < -0.015, pairs
    rounds = run(lambda n: [("path",) * 3 + ("plain",) * 3] * 3)
    assert rounds.verdict == "fail" and rounds.value < -single_mod.HARNESS_BOUND, rounds
