"""Per-phase wall times of a job (issue 28): set-up apart from measurement, in the log and result."""
import contextlib
import json
import logging
import time

import pytest

from gpulab import phases, results
from gpulab.stage import stage_main


def _work():
    time.sleep(0.05)
    return 42


def test_recorder_logs_and_sums(caplog):
    rec = phases.start("demo")
    with caplog.at_level(logging.INFO, logger="gpulab.phases"):
        with phases.phase("load", phases.SETUP):
            time.sleep(0.01)
        with phases.phase("measure"):
            time.sleep(0.02)
    assert [r["phase"] for r in rec.rows] == ["load", "measure"]
    t = phases.Recorder.sums(rec.rows)
    assert t[phases.SETUP] >= 0.01 and t[phases.MEASUREMENT] >= 0.02
    assert "demo: phase load (set-up)" in caplog.text and "phase measure (measurement)" in caplog.text
    with pytest.raises(ValueError, match="phase kind"):
        rec.record("x", 1.0, "warm-up")


def test_a_stage_result_lists_its_phases(tmp_path):
    def run(ctx):
        ctx.devices()
        with phases.phase("the benchmark"):
            time.sleep(0.02)
        return ctx.new_result("cpu")

    out = tmp_path / "r.h5"
    cfg = json.dumps({"stage": {}, "devices": {"backend": "cpu", "cpu_devices": 1},
                      "validated": True})
    assert stage_main("probe", run, argv=["--config-json", cfg, "--out", str(out)]) == 0
    a = results.read_attrs(out)
    got = {r["phase"]: r for r in a["phases"]}
    assert got["start-up (interpreter start, imports)"]["kind"] == phases.SETUP
    assert got["device discovery"]["kind"] == phases.SETUP
    assert got["the benchmark"]["kind"] == phases.MEASUREMENT
    assert got["the benchmark"]["seconds"] >= 0.02 and a["run_s"] >= 0.02


@pytest.mark.parametrize("marked", [False, True])
def test_the_summary_line_calls_unmarked_time_unmarked(tmp_path, capfd, marked):
    """A stage that marks no phase inside its run spent that time unmarked, not 0 s measuring; one
    that marks its benchmark has it as measurement and nothing much unmarked."""
    import re

    def run(ctx):
        with phases.phase("the benchmark") if marked else contextlib.nullcontext():
            time.sleep(0.2)
        return ctx.new_result("cpu")

    cfg = json.dumps({"stage": {}, "devices": {"backend": "cpu", "cpu_devices": 1},
                      "validated": True})
    # (the job's own log handler on stderr, as in a Snakemake log: it replaces pytest's)
    assert stage_main("probe", run, argv=["--config-json", cfg, "--out", str(tmp_path / "r.h5")]) == 0
    err = capfd.readouterr().err
    m = re.search(r"probe/main: run ([\d.]+) s: measurement ([\d.]+) s and set-up ([\d.]+) s in "
                  r"marked phases, ([\d.]+) s unmarked; start-up before it ([\d.]+) s", err)
    assert m, err
    run_s, measured, setup, unmarked, startup = map(float, m.groups())
    assert run_s >= 0.2 and startup > 0
    if marked:
        assert measured >= 0.2 and unmarked < 0.1
    else:
        assert measured == 0 and unmarked >= 0.2


@pytest.mark.slow
def test_an_isolated_process_reports_its_start_up_apart_from_its_work():
    from gpulab.transfer.isolate import run_isolated

    rec = phases.start("transfer")
    assert run_isolated(_work) == 42
    (startup, work) = rec.rows
    assert startup["phase"] == "_work: process start-up (spawn, imports)"
    assert startup["kind"] == phases.SETUP and startup["seconds"] > 0
    assert work["phase"] == "_work" and work["kind"] == phases.MEASUREMENT
    assert work["seconds"] >= 0.05
