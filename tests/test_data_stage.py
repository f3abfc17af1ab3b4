"""The data stage end to end (in-process, tiny config): result tables, files, failure hygiene,
and the report section."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import stage_settings
from gpulab import outcomes, results, stages
from gpulab.data.stage import main
from gpulab.kit.html import Figures

REPO = Path(__file__).resolve().parents[1]
TINY = {"seed": 3, "digits": False, "tabular_rows": [60, 150], "tabular_features": 4, "image_rows": [9],
        "image_shape": [1, 4, 4], "classes": 3, "formats": ["csv", "json", "jsonl", "h5", "h5-lzf"],
        "batch_rows": 32, "repeats": 1, "warmup": 0, "text_max_rows": 100}


def run_stage(tmp_path, cfg, name="main"):
    out = tmp_path / "res" / f"{name}.h5"
    argv = ["--config-json", json.dumps({"stage": cfg, "devices": {"backend": "cpu"}}),
            "--out", str(out), "--files-dir", str(tmp_path / "res" / "files")]
    return main(None, argv), out


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("data-stage")
    rc, out = run_stage(tmp, TINY)
    assert rc == 0
    return out


def test_result_tables_and_checks(result):
    loads = results.read_table(result, "loads")
    # 150 rows is over text_max_rows: HDF5 only; the others get every format
    assert set(loads[loads["dataset"] == "tabular-150x4"]["format"]) == {"h5", "h5-lzf"}
    assert len(loads[loads["dataset"] == "tabular-60x4"]) == 3 + 1 + 1 + 2 + 2
    assert (loads["round_trip"] == "pass").all()
    assert (loads["load_s_median"] > 0).all() and (loads["file_bytes"] > 0).all()
    assert (loads["load_s_min"] <= loads["load_s_median"]).all()
    assert (loads["peak_mem_bytes"] >= 0).all()
    stream = loads[loads["streaming"]]
    assert (stream["first_batch_rows"] <= 32).all()
    assert loads.attrs["units"]["file_MBps"].startswith("MB/s")
    checks = results.read_table(result, "checks")
    assert list(checks.columns) == outcomes.CHECK_COLUMNS and (checks["check"] == "round trip").all()
    assert len(checks) == len(loads) and (checks["verdict"] == "pass").all()
    assert "tabular-60x4 csv/pandas" in set(checks["case"])
    writes = results.read_table(result, "writes")
    assert set(writes["format"]) == set(TINY["formats"])
    files = sorted(p.name for p in (result.parent / "files").iterdir())
    assert "tabular-60x4.csv" in files and "images-9x1x4x4.lzf.hdf5" in files
    assert "tabular-150x4.hdf5" in files and "tabular-150x4.csv" not in files
    a = results.read_attrs(result)
    assert a["stage"] == "data" and a["device_kind"] == "cpu" and a["verdict"] == "pass"
    assert "checks_passed" not in a and a["verdict_summary"].split(": ", 1)[1].startswith(
        f"{len(loads)} of {len(loads)} checks")  # after the judged count
    assert set(stages.get("data").tables) <= set(results.list_contents(result)["tables"])


def test_external_input_is_benchmarked(tmp_path, result):
    src = result.parent / "files" / "tabular-60x4.jsonl"
    cfg = {**TINY, "digits": False, "image_rows": [], "formats": ["h5"],
           "inputs": [{"path": str(src)}]}
    rc, out = run_stage(tmp_path, cfg)
    assert rc == 0
    loads = results.read_table(out, "loads")
    ext = loads[loads["kind"] == "external"]
    assert list(ext["dataset"]) == ["tabular-60x4.jsonl"] and ext["rows"].iloc[0] == 60
    # nothing to compare an external file with: its round trip is not applicable, never a pass
    assert list(ext["round_trip"]) == ["not_applicable"]
    na = results.read_table(out, "not_applicable")
    assert len(na) == 1 and "no reference" in na["reason"].iloc[0]


def test_bad_input_fails_the_job_and_leaves_nothing(tmp_path, capsys):
    cfg = {**TINY, "tabular_rows": [20], "image_rows": [], "formats": ["csv"]}
    bad = tmp_path / "bad.csv"
    bad.write_text("a,label\n1.0,0\n2.0,1,9\n")
    rc, out = run_stage(tmp_path, {**cfg, "inputs": [{"path": str(bad)}]})
    assert rc == 1
    assert "bad.csv, line 3: malformed CSV" in capsys.readouterr().err
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())
    bad.write_text("a,label\n1.0,0\n2.0,\n")  # NaN label: found only when loading, after writing
    rc, out = run_stage(tmp_path, {**cfg, "inputs": [{"path": str(bad)}]})
    assert rc == 1
    assert "bad.csv, line 3, key 'label': label is NaN" in capsys.readouterr().err
    assert not any((tmp_path / "res").iterdir())  # neither the result nor the files nor temporaries


@pytest.mark.slow
def test_report_section_renders_and_has_headlines(result):
    import importlib

    section = importlib.import_module(stages.get("data").section_module())
    assert section.__name__ == "gpulab.data.section"

    figs = Figures()
    html = section.render([result], figs)
    assert figs.figure_no == 2 and figs.table_no >= 2 and "round trip" in html.lower()
    lines = section.headlines([result])
    assert len(lines) == 1 and "tabular rows" in lines[0] and " M" in lines[0]
    assert "MB = 10<sup>6</sup>" in section.METHODS and section.TITLE


@pytest.mark.slow
def test_script_help():
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "data.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "--files-dir" in p.stdout and "JSON lines" in p.stdout


@pytest.mark.slow
def test_sigterm_leaves_no_temporaries(tmp_path):
    """Snakemake stops a job with SIGTERM: the half-written files folder must not survive."""
    import signal
    import time

    cfg = {**TINY, "tabular_rows": [200000], "formats": ["csv", "json"], "repeats": 5,
           "text_max_rows": None}
    out = tmp_path / "res" / "main.h5"
    p = subprocess.Popen([sys.executable, str(REPO / "scripts" / "data.py"), "--config-json",
                          json.dumps({"stage": cfg}), "--out", str(out)],
                         stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"))
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "res").glob(".files.tmp-*/*")):
            assert p.poll() is None and time.monotonic() < deadline, "stage never started writing"
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
        assert rc == 143, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        p.kill()
    assert list((tmp_path / "res").iterdir()) == []
    assert "stopped by SIGTERM" in (tmp_path / "stderr").read_text()


def test_a_loader_returning_other_data_fails_its_round_trip_check(tmp_path):
    from gpulab.data import bench, datasets, formats

    case = bench.Case("tabular", datasets.tabular(40, 3, 2, seed=1))
    cfg = stage_settings("data", batch_rows=16, repeats=1, warmup=0)
    path, _ = bench.write_case(case, "csv", tmp_path, cfg)
    row, ok = bench.load_case(case, case.data.name, "tabular", path, "csv", "pandas",
                              formats.Schema.of(case.data), cfg)
    assert ok.verdict == "pass" and row["round_trip"] == "pass"
    case.data.x[3, 1] += 1.0  # the file now disagrees with what the reference says was written
    row, bad = bench.load_case(case, case.data.name, "tabular", path, "csv", "pandas",
                               formats.Schema.of(case.data), cfg)
    assert bad.verdict == "fail" and "MISMATCH: x equal False" in bad.note and row["round_trip"] == "fail"
    assert outcomes.overall({"checks": outcomes.checks_frame([ok, bad])})["verdict"] == "fail"
