"""gemm stage: layout arithmetic, the error check, the algorithms on gloo ranks, the stage, the report."""
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import REPO
from gpulab import config, launch, results
from gpulab.gemm import layout, numerics, runner, scaling
from gpulab.stage import stage_main

GEMM_SCHEMA = REPO / "workflow" / "schemas" / "gemm.schema.yaml"


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
    assert rows["passed"].all(), rows[["algorithm", "P", "dtype", "rel_error", "bound"]]
    assert (rows["rel_error"] > 0).all()  # real arithmetic, not a copied reference
    assert (rows["time_s_median"] > 0).all() and (rows["compute_s"] <= rows["time_s_median"]).all()


def test_scaling_uses_the_single_device_baseline_and_marks_missing_p():
    single = pd.DataFrame([{"M": 8, "N": 8, "K": 8, "dtype": "fp32", "time_s_median": 4.0}])
    multi = pd.DataFrame([
        {"transport": "nccl", "algorithm": "summa", "M": 8, "N": 8, "K": 8, "dtype": "fp32",
         "P": p, "time_s_median": t, "tflops_median": 1.0} for p, t in ((1, 5.0), (2, 2.5))])
    t = scaling.table(single, multi, [1, 2, 4], n_devices=2).set_index("P")
    assert t.loc[2, "speedup"] == pytest.approx(1.6) and t.loc[2, "efficiency"] == pytest.approx(0.8)
    assert t.loc[2, "efficiency_vs_p1"] == pytest.approx(1.0)
    assert t.loc[4, "status"] == "not applicable: 2 device(s) available" and math.isnan(t.loc[4, "speedup"])


def test_schema_fills_defaults_and_names_bad_keys():
    cfg = config.validate({}, GEMM_SCHEMA)
    assert cfg["dtypes"] == ["fp32", "tf32", "bf16"] and cfg["bar_size"] == 8192
    with pytest.raises(config.ConfigError, match=r"key 'dtypes\[0\]'.*fp64"):
        config.validate({"dtypes": ["fp64"]}, GEMM_SCHEMA)
    with pytest.raises(config.ConfigError, match=r"key 'sizes\[0\]'"):
        config.validate({"sizes": [[64, 64]]}, GEMM_SCHEMA)
    with pytest.raises(ValueError, match=r"gemm.sizes\[0\]"):
        runner.check_config({"sizes": [[8, 0, 8]], "algorithms": ["summa"], "ranks": [1]})


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


def test_stage_records_measurements_checks_and_what_is_not_applicable(stage_result):
    a = results.read_attrs(stage_result)
    assert a["device_kind"] == "cpu" and a["all_checks_passed"] is True and a["checks_total"] == 2 + 2 * 2 * 3
    single = results.read_table(stage_result, "single")
    assert list(single["dtype"]) == ["fp32", "bf16"] and single.attrs["units"]["tflops_median"] == "TFLOP/s"
    multi = results.read_table(stage_result, "multi")
    assert set(multi["P"]) == {1, 2} and set(multi["transport"]) == {"gloo"}
    assert multi["passed"].all()
    scal = results.read_table(stage_result, "scaling")
    assert (scal[scal["P"] == 3]["status"].str.startswith("not applicable")).all()
    bars = results.read_table(stage_result, "bars")
    assert list(bars.columns) == ["bar", "measured", "reference", "ratio", "threshold", "passed",
                                  "unit", "note"]
    assert bars["note"].iloc[0].startswith("not applicable")
    cov = results.read_table(stage_result, "coverage").set_index("item")
    assert cov.loc["dtype tf32", "status"] == "not applicable"
    assert cov.loc["NCCL P2P disabled", "status"] == "not applicable"


def test_report_section_renders_figures_tables_and_headlines(stage_result):
    from gpulab.report.html import Figures
    from gpulab.gemm import section

    figs = Figures()
    html = section.render([stage_result], figs)
    assert figs.figure_no == 3 and figs.table_no >= 4 and "14 of 14 GEMM results" in html
    heads = section.headlines([stage_result])
    assert 1 <= len(heads) <= 3 and "TFLOP/s" in heads[0]
    assert "2*M*N*K" in section.METHODS.replace("&middot;", "*") or "2MNK" in section.METHODS
    refs = section.references([stage_result])  # no H200 here: no reference rows
    assert list(refs.columns) == ["metric", "measured", "reference", "source", "fraction"]
