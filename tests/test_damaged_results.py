"""A damaged result is an error that names the file and the command that redoes it (issue 29):
when read, in `gpulab verify` (exit 1), in compare/fleet (exit 2), and in the report's abstract."""
from __future__ import annotations

import os
import sys

import h5py
import pandas as pd
import pytest

from gpulab import cli, probe, results
from gpulab.report import build_report
from gpulab.report import cli as report_cli
from test_report import _bench_result, _fake_section, _probe_info


def _sort_result() -> results.Result:
    r = results.Result("sort", "main", {"n": 8}, "cpu")
    r.add_table("runs", pd.DataFrame({"keys": [8, 16], "seconds": [0.5, 1.0]}), units={"seconds": "s"})
    return r


def _truncate(path) -> None:
    """What a full disk or a broken copy leaves: the first half of the file."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_HOST", "hostA")
    root = tmp_path / "results"
    files = {
        "probe": results.write(probe.build_result("probe", "main", {"gpus": "all"},
                                                  _probe_info("hostA")), root / "probe/hostA.h5"),
        "bench": results.write(_bench_result("hostA"), root / "fakebench/hostA/main.h5"),
        "sort": results.write(_sort_result(), root / "sort/hostA/main.h5"),
    }
    mod = _fake_section()
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return root, files


def test_results_record_the_tables_they_wrote(tree):
    _, files = tree
    a = results.read_attrs(files["sort"])
    assert a["written_tables"] == ["runs"] and a["written_matrices"] == []
    assert results.verify(files["sort"])["stage"] == "sort"


def test_truncated_result_is_an_error_naming_file_and_redo_command(tree):
    _, files = tree
    _truncate(files["sort"])
    for read in (results.read_attrs, lambda p: results.read_table(p, "runs"), results.verify):
        with pytest.raises(results.DamagedResult) as err:
            read(files["sort"])
        assert str(files["sort"]) in str(err.value)
        assert "snakemake --cores all --forcerun sort" in str(err.value)
    # Old behaviour was a WARNING and a skip: the caller now gets the error unless it collects.
    with pytest.raises(results.DamagedResult):
        list(results.with_attrs([files["sort"]]))


def test_result_missing_a_recorded_table_is_incomplete(tree):
    _, files = tree
    with h5py.File(files["sort"], "a") as f:
        del f["tables/runs"]
    with pytest.raises(results.DamagedResult, match="incomplete.*'runs'"):
        results.verify(files["sort"])


def test_gpulab_verify_exits_1_on_a_damaged_result_and_names_it(tree, capsys):
    root, files = tree
    assert cli.main(["verify", "--results-dir", str(root)]) == 0
    assert "3 result(s) whole, 0 damaged" in capsys.readouterr().out
    _truncate(files["sort"])
    assert cli.main(["verify", "--results-dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {files['sort']}" in out and "snakemake --cores all --forcerun sort" in out
    assert "2 result(s) whole, 1 damaged" in out


def test_fleet_and_compare_refuse_a_damaged_result(tree, capsys):
    root, files = tree
    _truncate(files["probe"])
    assert cli.main(["fleet", "--results-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert str(files["probe"]) in err and "--forcerun probe" in err


@pytest.mark.slow
def test_report_marks_the_missing_chapter_in_the_abstract_and_fails(tree, tmp_path):
    root, files = tree
    _truncate(files["sort"])
    b = build_report(list(files.values()), "Damaged")
    abstract = b.html.split('<section id="abstract">', 1)[1].split("</section>", 1)[0]
    assert "Missing from this report" in abstract and "sort" in abstract
    assert str(files["sort"]) in abstract and "snakemake --cores all --forcerun sort" in abstract
    assert b.damaged and len(b.errors) >= 1  # not "0 section error(s)"
    assert 'id="stage-fakebench"' in b.html  # the rest still renders
    # The report command (Snakemake's report rule) fails loudly, after writing the marked HTML.
    out = tmp_path / "report.html"
    rc = report_cli.main(["--results-dir", str(root), "--out", str(out), "--title", "t"])
    assert rc == 1 and "Missing from this report" in out.read_text()
