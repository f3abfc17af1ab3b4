"""Snakemake notices a damaged result (issue 29): the report rule fails naming the file and the
command that redoes it, `gpulab verify` exits 1, and that command repairs it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from conftest import CPU_ENV as ENV
from conftest import copy_run, snakemake

pytestmark = pytest.mark.e2e


def _verify(wf):
    return subprocess.run([sys.executable, "-m", "gpulab.cli", "verify"], cwd=wf, text=True,
                          capture_output=True, env={**os.environ, **ENV})


def test_truncated_result_fails_the_report_rule_until_redone(probe_report_run, tmp_path):
    # The session's finished probe + report run, copied (this test damages it). No PDF: the rule
    # under test is the HTML report's, and a print would only add Chromium's start.
    wf = copy_run(probe_report_run, tmp_path / "wf")
    cfg = yaml.safe_load((wf / "config.yaml").read_text())
    assert cfg["report"]["stages"] == ["probe"]
    cfg["report"]["pdf"] = False
    (wf / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert _verify(wf).returncode == 0

    probe = wf / "results/probe/testhost.h5"
    with open(probe, "r+b") as f:  # what a full disk or a broken copy leaves
        f.truncate(os.path.getsize(probe) // 2)
    p = snakemake(wf, "--cores", "2", "--forcerun", "report", env=ENV, check=False)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert "damaged result results/probe/testhost.h5" in out, out[-3000:]
    assert "snakemake --cores all --forcerun probe" in out
    v = _verify(wf)
    assert v.returncode == 1 and "DAMAGED results/probe/testhost.h5" in v.stdout, v.stdout

    snakemake(wf, "--cores", "2", "--forcerun", "probe", env=ENV)  # the command it named
    assert _verify(wf).returncode == 0
    assert 'name="gpulab-damaged-results" content="0"' in (
        wf / "results/report/report.html").read_text()
