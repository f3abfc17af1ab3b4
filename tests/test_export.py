"""gpulab export: the tidy long table, its three formats read back identical to the HDF5 results."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from gpulab import cli, export, results
from exportfixtures import make_results


@pytest.fixture
def res(tmp_path):
    root = tmp_path / "results"
    make_results(root)
    make_results(root, host="h200b")
    return root


def _hdf5_values(files) -> dict:
    """(host, stage, table, column, row) -> value of every float cell, read through gpulab.results."""
    out = {}
    for f in files:
        a = results.read_attrs(f)
        for t in results.list_contents(f)["tables"]:
            df = results.read_table(f, t)
            for c in df.columns:
                if pd.api.types.is_float_dtype(df[c]):
                    for i, v in enumerate(df[c]):
                        if not math.isnan(v):
                            out[(a["host"], a["stage"], t, c, i)] = float(v)
    return out


@pytest.mark.slow
def test_every_float_cell_is_one_row_and_formats_read_back_identical(res, tmp_path):
    files = results.find_results(res)
    df = export.tidy(files)
    cells = _hdf5_values(files)
    matrix = df["table"].str.startswith("matrix/")
    samples = df["statistic"] == "sample"
    # one row per measured value: every float cell of every table, plus the samples and matrices
    assert len(df[~matrix & ~samples]) == len(cells)
    assert sorted(df[~matrix & ~samples]["value"]) == sorted(cells.values())
    assert len(df[matrix]) == 2 * 4  # two transfer results, 2x2 matrix each
    written = export.write(df, tmp_path / "out" / "results")
    assert sorted(p.suffix for p in written) == [".csv", ".jsonl", ".parquet"]
    for p in written:
        back = export.read(p)
        pd.testing.assert_frame_equal(back.reset_index(drop=True), df.reset_index(drop=True),
                                      check_exact=True)


@pytest.mark.slow
def test_rows_carry_keys_units_statistics_and_provenance(res):
    df = export.tidy(results.find_results(res), hosts=["h200a"])
    assert set(df["host"]) == {"h200a"}
    h2d = df[(df["table"] == "host_device") & (df["metric"] == "value")
             & (df["statistic"] == "median")]
    keys = [json.loads(k) for k in h2d["keys"]]
    pinned = h2d[[k["direction"] == "H2D" and k["memory"] == "pinned" for k in keys]]
    assert list(pinned["value"]) == [55.3] and list(pinned["unit"]) == ["GB/s"]
    assert {"bytes", "copies", "device", "call", "verified"} <= set(keys[0])  # what was measured
    assert "note" not in keys[0] and "samples_s" not in keys[0]
    samp = df[(df["table"] == "host_device") & (df["statistic"] == "sample")]
    assert len(samp) == 4 * 3 and set(samp["unit"]) == {"s"}
    g = df[(df["stage"] == "gemm") & (df["metric"] == "tflops")]
    assert set(g["gpu_model"]) == {"NVIDIA H200"} and set(g["unit"]) == {"TFLOP/s"}
    en = df[(df["table"] == "energy") & (df["host"] == "h200a")]  # units "see column X"
    assert dict(en[["metric", "unit"]].values) == {
        "work": "GB", "duration_s": "s", "energy_J": "J", "avg_W": "W", "throughput": "GB/s",
        "efficiency": "GB/J", "per_op": "J/GB"}
    assert (df["commit"] != "").all() and (df["config_hash"].str.len() == 16).all()
    assert df["time"].str.match(r"\d{4}-\d\d-\d\dT").all()


@pytest.mark.slow
def test_filters_stage_host_since(res):
    files = results.find_results(res)
    assert set(export.tidy(files, stages=["gemm"])["stage"]) == {"gemm"}
    assert set(export.tidy(files, hosts=["h200b"])["host"]) == {"h200b"}
    assert export.tidy(files, since="2999-01-01").empty
    assert len(export.tidy(files, since="2000-01-01")) == len(export.tidy(files))
    with pytest.raises(export.ExportError, match="--since 'yesterday'"):
        export.tidy(files, since="yesterday")


def test_cli_export_writes_three_formats(res, tmp_path, capsys):
    out = tmp_path / "exp" / "all"
    assert cli.main(["export", "--results-dir", str(res), "--out", str(out), "--stage", "transfer"]) == 0
    back = export.read(out.with_name("all.parquet"))
    assert set(back["stage"]) == {"transfer"}
    assert "rows" in capsys.readouterr().out
    assert cli.main(["export", "--results-dir", str(res), "--out", str(out), "--since", "x"]) == 2


def test_read_names_a_file_that_is_not_an_export(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(export.ExportError, match="x.csv: not a gpulab export"):
        export.read(bad)


@pytest.mark.e2e
def test_snakemake_export_target_follows_the_stage_results(workflow_dir):
    from conftest import planned_rules

    counts = planned_rules(workflow_dir, "export")
    assert counts.get("export") == 1
    assert counts.get("probe") == 1 and "report" not in counts  # the results, not the report
