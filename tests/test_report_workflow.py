"""The report rule end to end in a private copy of the workflow: HTML, figures, PDF (where Chromium
is installed), another host's results side by side, and `snakemake --report` with categories.

Only the probe and the report run here (config report.stages: [probe], the session's
probe_report_run of tests/conftest.py), so this stays fast; tests/test_workflow.py runs the whole
pipeline.
"""
from __future__ import annotations

import re

import pytest

from conftest import CPU_ENV as ENV
from conftest import copy_run, snakemake
from gpulab import results
from gpulab.report import browser

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def report_run(probe_report_run, tmp_path_factory):
    """The session's probe + report run (another host's probe beside ours), copied: the last tests
    here leave the PDF target to rules that refuse."""
    return copy_run(probe_report_run, tmp_path_factory.mktemp("report") / "wf")


def test_rule_writes_html_with_both_hosts_and_figures(report_run):
    html = (report_run / "results/report/report.html").read_text()
    assert 'name="gpulab-section-errors" content="0"' in html
    header = re.search(r'<section id="system">.*?<thead>(.*?)</thead>', html, re.S).group(1)
    assert "testhost" in header and "otherhost" in header
    figs = sorted((report_run / "results/report/figures").glob("fig*.png"))
    assert figs and len(figs) == len(re.findall(r"<b>Figure \d+\.</b>", html))
    ids = [results.read_attrs(f)["result_id"] for f in results.find_results(report_run / "results")]
    assert len(ids) == 2 and all(i in html for i in ids)


@pytest.mark.skipif(browser.find_chromium() is None, reason="Chromium is not installed")
def test_rule_prints_the_pdf_and_the_html_loads_in_chromium(report_run):
    from pypdf import PdfReader

    reader = PdfReader(report_run / "results/report/report.pdf")
    assert len(reader.pages) >= 2
    assert all((p.extract_text() or "").strip() or p.images for p in reader.pages)
    seen = browser.inspect(report_run / "results/report/report.html")
    assert seen["images"] and all(i["naturalWidth"] > 0 for i in seen["images"])
    assert seen["errors"] == 0 and all(s["text"] > 40 for s in seen["sections"]), seen["sections"]


def test_snakemake_report_has_captions_and_categories(report_run):
    out = report_run / "results/report/snakemake-report.html"
    snakemake(report_run, "--cores", "1", "--report", str(out), env=ENV)
    text = out.read_text()
    for expected in ("report.html", "fig01.png", "Figures", "written like a systems paper"):
        assert expected in text, expected


def test_without_chromium_the_html_is_planned_and_the_pdf_says_why(report_run):
    # Runs last: it leaves the copy's PDF target to a rule that refuses.
    env = {**ENV, "GPULAB_CHROMIUM": ""}
    p = snakemake(report_run, "--cores", "1", "--dry-run", "--forcerun", "report", env=env)
    out = p.stdout + p.stderr
    assert "no Chromium found" in out and re.search(r"^report\s+1$", out, re.M)
    p = snakemake(report_run, "--cores", "1", "-f", "results/report/report.pdf", env=env, check=False)
    assert p.returncode != 0 and "apt-get install chromium" in p.stdout + p.stderr


def test_report_pdf_false_builds_the_html_only_and_a_pdf_request_says_so(report_run):
    """The health preset's setting: no Chromium start, and no PDF output in the plan."""
    cfg = ["--config", "report={pdf: false}"]
    p = snakemake(report_run, "--cores", "1", "--dry-run", "--forcerun", "report", *cfg, env=ENV)
    out = p.stdout + p.stderr
    assert re.search(r"^report\s+1$", out, re.M) and "report.pdf" not in out
    assert "no Chromium found" not in out
    p = snakemake(report_run, "--cores", "1", "-f", "results/report/report.pdf", *cfg, env=ENV,
                  check=False)
    assert p.returncode != 0 and "report.pdf is false in the config" in p.stdout + p.stderr
