"""gpulab bundle (manifest, verify catches tampering), the Prometheus textfile, the README table."""
from __future__ import annotations

import io
import os
import json
import tarfile

import pytest

from gpulab import bundle, cli, export, export_prom, readme_table, results
from exportfixtures import make_results


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "results"
    make_results(root)
    (root / "report").mkdir()
    (root / "report" / "report.html").write_text("<html>report</html>")
    (root / "payloads").mkdir()
    (root / "payloads" / "gemm-1.json").write_text('{"stage": {}}')
    # the data stage's generated datasets: big, regenerable, not results
    ds = root / "data" / "h200a" / "files"
    ds.mkdir(parents=True)
    (ds / "big.csv").write_text("x\n" * 1000)
    (ds / "train.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"0" * 100)
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "ref.yaml").write_text("metrics: {}\n")
    (tmp_path / "config.yaml").write_text("devices: {}\n")
    return tmp_path


def _bundle(run):
    out = run / "b.tar.gz"
    bundle.create(out, run / "results", [run / "config.yaml"], run / "baselines")
    return out


def test_bundle_holds_the_run_without_datasets_and_verifies(run):
    out = _bundle(run)
    assert bundle.verify(out) == []
    m = bundle.manifest(out)
    names = set(m["files"])
    assert {"report/report.html", "config/config.yaml", "config/payloads/gemm-1.json",
            "config/from_results.json", "baselines/ref.yaml", "export/results.parquet",
            "export/results.csv", "export/results.jsonl", "results/probe/h200a.h5",
            "results/gemm/h200a/main.h5", "results/transfer/h200a/main.h5"} <= names
    assert not any(n.startswith("results/data/") for n in names)
    assert m["commit"] and m["host"]
    with tarfile.open(out) as tar:
        data = tar.extractfile("export/results.csv").read()
    assert bundle.sha256(data) == m["files"]["export/results.csv"]["sha256"]


def _rewrite(src, dst, change):
    with tarfile.open(src) as tin, tarfile.open(dst, "w:gz") as tout:
        for mem in tin.getmembers():
            data = tin.extractfile(mem).read()
            data = change(mem.name, data)
            if data is None:
                continue
            info = tarfile.TarInfo(mem.name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))


def test_verify_fails_on_a_tampered_missing_or_extra_file(run, capsys):
    out = _bundle(run)
    bad = run / "bad.tar.gz"
    _rewrite(out, bad, lambda n, d: d.replace(b"report", b"REPORT") if n == "report/report.html"
             else d)
    problems = bundle.verify(bad)
    assert len(problems) == 1 and problems[0].startswith("report/report.html: sha256")
    assert cli.main(["bundle", str(bad), "--verify"]) == 1
    assert "report/report.html" in capsys.readouterr().err
    _rewrite(out, bad, lambda n, d: None if n == "baselines/ref.yaml" else d)
    assert bundle.verify(bad) == ["baselines/ref.yaml: listed in the manifest, missing from the "
                                  "bundle"]
    assert cli.main(["bundle", str(out), "--verify"]) == 0


def test_prometheus_file_parses_with_the_client_library(run, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    files = results.find_results(run / "results")
    text = export_prom.text(files)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"gpulab_metric_median", "gpulab_bar_ratio", "gpulab_bar_pass",
            "gpulab_result_verdict"} <= set(fams)
    med = {s.labels["metric"]: s for s in fams["gpulab_metric_median"].samples}
    gemm = med["gemm/single/M=8192/N=8192/K=8192/bf16"] if "gemm/single/M=8192/N=8192/K=8192/bf16" \
        in med else next(s for m, s in med.items() if m.startswith("gemm/") and "bf16" in m)
    assert gemm.labels["host"] == "h200a" and gemm.labels["model"] == "NVIDIA H200"
    assert {"host", "gpu", "metric", "unit"} <= set(gemm.labels)
    bars = {s.labels["metric"]: s.value for s in fams["gpulab_bar_ratio"].samples}
    assert bars["pinned H2D vs PCIe limit, GPU0"] == pytest.approx(55.3 / 63.0)
    gpu0 = [s for s in fams["gpulab_bar_pass"].samples if s.labels["gpu"] == "0"]
    assert gpu0 and all(s.value == 1.0 for s in gpu0)
    states = [s for s in fams["gpulab_result_verdict"].samples
              if s.labels["stage"] == "gemm" and s.value == 1.0]
    assert [s.labels["verdict"] for s in states] == ["pass"]
    out = tmp_path / "tf" / "gpulab"
    assert cli.main(["export", "--results-dir", str(run / "results"), "--format", "prom",
                     "--out", str(out)]) == 0
    assert list(text_string_to_metric_families(out.with_name("gpulab.prom").read_text()))


def test_prometheus_escapes_label_values():
    line = export_prom._line("m", {"metric": 'a "b"\\c\nd'}, 1.0)
    from prometheus_client.parser import text_string_to_metric_families

    (fam,) = text_string_to_metric_families(line + "\n")
    assert fam.samples[0].labels["metric"] == 'a "b"\\c\nd'


def test_readme_table_agrees_with_its_export(run):
    exp = run / "docs" / "runs" / "2026-12-03-h200"
    df = export.tidy(results.find_results(run / "results"))
    (path,) = export.write(df, exp / "results", ["csv"])
    md = readme_table.table(path)
    rows = readme_table.parse(md)
    assert len(rows) == 2  # the two judged bars of the fixture
    back = readme_table.bar_rows(export.read(path)).set_index("bar")
    for r in rows:
        e = back.loc[r["bar"]]
        for col in ("measured", "reference", "ratio"):
            assert r[col] == float(readme_table.fmt(e[col])), (r["bar"], col)
        assert (r["verdict"], r["source"], r["host"]) == (e["verdict"], e["source"], e["host"])
    readme = run / "README.md"
    readme.write_text("# x\n")
    assert cli.main(["readme-table", str(path), "--check", str(readme)]) == 1
    assert cli.main(["readme-table", str(path), "--update", str(readme)]) == 0
    assert cli.main(["readme-table", str(path), "--check", str(readme)]) == 0
    # a number typed by hand into the table no longer agrees with the export
    readme.write_text(readme.read_text().replace("| 733 TFLOP/s", "| 750 TFLOP/s"))
    assert cli.main(["readme-table", str(path), "--check", str(readme)]) == 1


@pytest.mark.slow  # a second interpreter with the whole CLI: 2 s
def test_python_dash_m_gpulab_runs_the_cli_from_a_checkout(run):
    # A GPU node without the console script (PYTHONPATH=src, the acceptance script) uses
    # `python -m gpulab`; a damaged result must still exit 1 through it.
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    ok = subprocess.run([sys.executable, "-m", "gpulab", "verify", "--results-dir",
                         str(run / "results")], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    victim = next((run / "results" / "gemm").rglob("*.h5"))
    victim.write_bytes(victim.read_bytes()[:200])
    bad = subprocess.run([sys.executable, "-m", "gpulab", "verify", "--results-dir",
                          str(run / "results")], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and victim.name in bad.stdout + bad.stderr
