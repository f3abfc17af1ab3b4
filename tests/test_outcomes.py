"""The result vocabulary: verdicts, bars that can fail, crashed cases counted, datasheet limits."""
import math

import pandas as pd
import pytest

from gpulab import limits, outcomes
from gpulab.outcomes import Bar, Check, NotApplicable, Verdict


def test_verdict_has_exactly_three_values():
    assert outcomes.VERDICTS == ("pass", "fail", "not_applicable")
    with pytest.raises(ValueError, match="not a verdict"):
        Verdict.parse("yes")


def test_bar_passes_then_fails_on_a_degraded_measurement():
    good = Bar.measure("copy", 4000, 4800, source="datasheet", threshold=0.7, unit="GB/s")
    slow = Bar.measure("copy", 2000, 4800, source="datasheet", threshold=0.7, unit="GB/s")
    assert good.verdict == "pass" and math.isclose(good.ratio, 4000 / 4800)
    assert slow.verdict == "fail"


def test_lower_is_better_bar_fails_when_overhead_grows():
    assert Bar.measure("overhead", 1.01, 1.0, source="raw call", threshold=1.05, unit="1",
                       direction="<=").verdict == "pass"
    assert Bar.measure("overhead", 1.5, 1.0, source="raw call", threshold=1.05, unit="1",
                       direction="<=").verdict == "fail"


def test_missing_reference_is_not_applicable_and_missing_measurement_fails():
    assert Bar.measure("x", 1.0, None, source="s", threshold=0.5, unit="").verdict == "not_applicable"
    assert Bar.measure("x", float("nan"), 2.0, source="s", threshold=0.5, unit="").verdict == "fail"
    with pytest.raises(ValueError, match="source"):
        Bar.measure("x", 1.0, 2.0, source="", threshold=0.5, unit="")


def test_overall_counts_crashes_and_failures():
    checks = outcomes.checks_frame([Check.of("sorted", i, True) for i in range(131)]
                                   + [Check.crashed("n=4", RuntimeError("rank 2 died"))])
    ov = outcomes.overall({"checks": checks})
    assert ov["verdict"] == "fail"
    assert ov["counts"]["crashed"] == 1
    assert ov["summary"].startswith("132 judged (132 checks, 0 bars), 1 failed, 0 not applicable: "
                                  "131 of 132 checks passed, 1 failed (1 crashed)")


def test_overall_not_applicable_when_nothing_was_judged():
    ov = outcomes.overall({"bars": outcomes.bars_frame([Bar.not_applicable("p2p", "one device")]),
                           "not_applicable": outcomes.not_applicable_frame([NotApplicable("p2p", "one device")])})
    assert ov["verdict"] == "not_applicable"


def test_overall_leads_with_the_judged_count_and_never_reads_0_of_0_bars_met():
    """Issue 24: checks passed but every bar not applicable is a pass that judged no bar."""
    ov = outcomes.overall({
        "checks": outcomes.checks_frame([Check.of("sorted", i, True) for i in range(3)]),
        "bars": outcomes.bars_frame([Bar.not_applicable("p2p", "one device"),
                                     Bar.not_applicable("copy", "no datasheet figure for B200")]),
        "not_applicable": outcomes.not_applicable_frame([NotApplicable("p2p", "one device")])})
    assert ov["verdict"] == "pass"
    assert ov["summary"].startswith("3 judged (3 checks, 0 bars), 0 failed, 3 not applicable: ")
    assert "0 of 0" not in ov["summary"] and "no bar judged (2 not applicable)" in ov["summary"]
    assert ov["counts"]["judged"] == 3 and ov["counts"]["failed"] == 0
    met = outcomes.overall({"bars": outcomes.bars_frame([
        Bar.measure("copy", 4000, 4800, source="datasheet", threshold=0.7, unit="GB/s"),
        Bar.measure("copy", 1000, 4800, source="datasheet", threshold=0.7, unit="GB/s")])})
    assert met["summary"].startswith("2 judged (0 checks, 2 bars), 1 failed, 0 not applicable: ")
    assert "1 of 2 bars met" in met["summary"] and met["verdict"] == "fail"


def test_within_check_fails_beyond_its_bound():
    assert Check.within("rel_error", "fp32", 1e-7, 1e-5).verdict == "pass"
    assert Check.within("rel_error", "fp32", 1e-2, 1e-5).verdict == "fail"
    assert Check.within("rel_error", "fp32", float("nan"), 1e-5).verdict == "fail"


def test_frames_reject_free_form_verdicts():
    with pytest.raises(ValueError):
        outcomes.checks_frame([{"check": "a", "case": "b", "verdict": "yes"}])


def test_limits_known_models_and_unknown_gives_reason():
    assert limits.memory_bandwidth("NVIDIA H200").value == 4800
    assert limits.model_of("NVIDIA H100 PCIe")["model"] == "H100 PCIe"
    assert limits.model_of("NVIDIA H100 80GB HBM3")["model"] == "H100 SXM"
    assert limits.peak_tflops("NVIDIA RTX A5000", "bf16").known
    unknown = limits.peak_tflops("Imaginary GPU 9000", "bf16")
    assert not unknown.known and "Imaginary GPU 9000" in unknown.reason
    assert limits.nvlink_bandwidth("NVIDIA L40S").reason.endswith("has no NVLink")
    for m in limits.table()["models"]:
        assert m["source"], m["model"]


def test_pcie_limit_from_generation_and_width():
    assert limits.pcie_bandwidth(5, 16).value == pytest.approx(63.0, rel=1e-3)
    assert limits.pcie_bandwidth(3, 8).value == pytest.approx(7.88, rel=1e-3)
    assert not limits.pcie_bandwidth(None, 16).known


def test_result_file_carries_the_overall_verdict(tmp_path):
    from gpulab import results

    r = results.Result("demo", "main", {}, "cpu")
    r.add_table("checks", outcomes.checks_frame([Check.of("sum", "a", False, note="off by one")]))
    path = results.write(r, tmp_path / "r.h5")
    attrs = results.read_attrs(path)
    assert attrs["verdict"] == "fail" and "sum [a]" in attrs["verdict_summary"]


@pytest.mark.parametrize("name, model, gbps, bf16", [
    ("NVIDIA GH200 480GB", "GH200 480GB", 4000, 989.5),  # was matched as an H200 SXM (4800)
    ("NVIDIA H100 NVL", "H100 NVL", 3900, 835.5),  # was matched as an H100 SXM (3350, 989.5)
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB", 1555, 312),  # was the 80GB part's 2039
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 1555, 312),  # was the 80GB PCIe part's 1935
    ("NVIDIA B200", "B200", 8000, 2250),
    ("NVIDIA H200", "H200 SXM", 4800, 989.5),
    ("nvidia  h200 nvl", "H200 NVL", 4800, 835.5),
])
def test_limits_match_whole_driver_names(name, model, gbps, bf16):
    assert limits.model_of(name)["model"] == model
    assert limits.memory_bandwidth(name).value == gbps
    assert limits.peak_tflops(name, "bf16").value == bf16


def test_limits_unknown_or_partial_name_is_not_applicable_naming_it():
    for name in ("NVIDIA H200 Prototype", "H200", "NVIDIA Imaginary 9000"):
        lim = limits.memory_bandwidth(name)
        assert not lim.known and repr(name) in lim.reason, name
    names = [n for m in limits.table()["models"] for n in m["names"]]
    assert len(names) == len(set(names))  # one model per driver name


def _verdict_literals(path) -> list[str]:
    """Where a module spells a verdict as a string: 'pass'/'fail' anywhere as a whole string, and
    'not_applicable' beside a comparison (elsewhere it is also the name of a table)."""
    import io
    import tokenize

    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
    comparisons = {"==", "!=", "in", "not"}
    hits = []
    for i, t in enumerate(toks):
        if t.type != tokenize.STRING:
            continue
        value = t.string.strip("'\"")
        if t.string[:1] not in "'\"" or value not in outcomes.VERDICTS:
            continue  # prefixed strings (f"...") and other values
        near = {toks[j].string for j in (i - 1, i + 1) if 0 <= j < len(toks)}
        if value != "not_applicable" or near & comparisons:
            hits.append(f"{path}:{t.start[0]}: {t.line.strip()}")
    return hits


def test_verdicts_are_compared_as_members_outside_outcomes():
    """A verdict spelled as a literal drifts from the vocabulary unseen (a typo compares False)."""
    from pathlib import Path

    import gpulab

    root = Path(gpulab.__file__).parent
    hits = [h for p in sorted(root.rglob("*.py")) if p.name != "outcomes.py" or p.parent != root
            for h in _verdict_literals(p)]
    assert not hits, "verdict literals outside gpulab.outcomes:\n" + "\n".join(hits)


def test_verdict_literal_scan_finds_a_comparison(tmp_path):
    """The scan above is not vacuous: it finds each kind of literal it forbids."""
    f = tmp_path / "m.py"
    f.write_text('ok = v == "pass"\nx = v in ("fail",)\ny = v != "not_applicable"\n'
                 'tables = ("bars", "not_applicable")\n')
    assert [h.split(": ", 1)[0].rsplit(":", 1)[1] for h in _verdict_literals(f)] == ["1", "2", "3"]


def test_reference_rows_round_trip_through_a_frame_and_the_report_check():
    from gpulab.report.references import normalize_references

    rows = [outcomes.Reference.of("copy GB/s", 500.0, 1000.0, "seed A5000"),
            outcomes.Reference.of("no reference", 3.0, float("nan"), "datasheet"),
            outcomes.Reference.of_bar("peak (h200)", Bar.measure("peak", 80, 100, source="datasheet",
                                                                 threshold=0.7, unit="TFLOP/s"))]
    df = outcomes.references_frame(rows)
    assert list(df.columns) == outcomes.REFERENCE_COLUMNS == ["metric", "measured", "reference",
                                                              "source", "fraction"]
    assert df["fraction"].iloc[0] == 0.5 and math.isnan(df["fraction"].iloc[1])
    assert df["fraction"].iloc[2] == pytest.approx(0.8)
    back = [outcomes.Reference(**r) for r in normalize_references(df).to_dict("records")]
    assert [r.metric for r in back] == [r.metric for r in rows]
    assert back[0] == rows[0] and back[2] == rows[2]
    assert outcomes.references_frame([]).columns.tolist() == outcomes.REFERENCE_COLUMNS


@pytest.mark.parametrize("column, unit", [
    ("time_s_median", "s"), ("load_s_stdev", "s"), ("busbw_GBps_min", "GB/s"), ("gbps_max", "GB/s"),
    ("tflops_median", "TFLOP/s"), ("peak_mem_bytes", "B"), ("bytes_moved", "B"), ("launch_unix", "s (Unix time)"),
    ("sm_clock_max_mhz", "MHz"), ("pcie_gen_now", "PCIe generation"), ("power_limit_w", "W"),
    ("energy_J", "J"), ("bucket_cap_mb", "MB"), ("moved_fraction", "1"), ("grad_rel_err", "1"),
    ("logical_devices", "count"), ("samples_s", "s per sample (JSON list)"), ("keys_per_s", "keys/s"),
    ("cuda_visible_devices", "device ids"), ("value_rw_median", "GB/s (read+write)"), ("dtype", None),
    ("nvlinks_switch", "links"), ("pcie_width_max", "lanes"),
])
def test_a_columns_unit_comes_from_its_name(column, unit):
    assert outcomes.unit_of(column) == unit


def test_units_per_row_notes_and_flags():
    energy = pd.DataFrame({"efficiency": [1.0], "efficiency_unit": ["GB/J"], "resolved": [True]})
    assert outcomes.units_for(energy) == {"efficiency": "see column efficiency_unit", "resolved": "bool"}
    rows = pd.DataFrame({"value_median": [1.0], "unit": ["GB/s"], "gbps": [2.0], "ok": [True]})
    assert outcomes.units_for(rows, {"value": "GB/s or us", "gbps": "read+write"}) == {
        "value_median": "see column 'unit' (GB/s or us)", "gbps": "GB/s (read+write)", "ok": "bool"}
    # without a unit column, value is a plain ratio
    assert outcomes.units_for(pd.DataFrame({"value": [0.1]})) == {"value": "1"}


def test_every_numeric_column_of_fixture_results_has_a_unit(tmp_path):
    """Result tables shaped like the stages' (the export fixtures: transfer, gemm, data): every
    number and flag gets a unit from the one table and the suffix rule. The whole pipeline's
    tables: tests/test_workflow.py."""
    from exportfixtures import make_results

    from gpulab import results

    seen = 0
    for f in make_results(tmp_path):
        for name in results.list_contents(f)["tables"]:
            df = results.read_table(f, name)
            units = outcomes.units_for(df)
            for c in df.columns:
                if pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
                    seen += 1
                    assert c in units, f"{f.name}:{name}: column {c!r} has no unit"
    assert seen > 20
