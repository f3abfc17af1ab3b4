"""Interrupting a run (Ctrl-C, SIGTERM, SIGKILL of Snakemake) leaves no process behind, and a plain
rerun finishes. Tiny single-stage targets keep each case to a few seconds of work."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
import yaml

from conftest import REPO, copy_workflow, kill_marked, marked_processes, planned_rules, snakemake

pytestmark = pytest.mark.e2e

HOST = "testhost"
TINY = {
    "gemm": {"sizes": [[64, 64, 64]], "dtypes": ["fp32"], "algorithms": ["row1d"], "ranks": [2],
             "warmup": 0, "repeats": 1},
    "collectives": {"ops": ["all_reduce"], "algorithms": ["ring"], "sizes_bytes": [64],
                    "warmup": 0, "repeats": 1, "iters": 1},
}
TARGETS = {
    "gemm": (f"results/gemm/{HOST}/main.h5", "gpulab.gemm.worker"),
    "collectives": (f"results/collectives/{HOST}/default.h5", "gpulab.collectives.worker"),
    "train": (f"results/train/{HOST}/tensor.h5", "gpulab.train.worker"),
}


def _write_config(wf):
    cfg = yaml.safe_load((wf.parent / "config.orig.yaml").read_text())
    for section, values in TINY.items():
        cfg.setdefault(section, {}).update(values)
    cfg["train"].update({"variants": ["tensor"], "tensor_batches": [4], "warmup": 0, "repeats": 1})
    (wf / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _tiny_workflow(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    (tmp_path / "config.orig.yaml").write_text((wf / "config.yaml").read_text())
    _write_config(wf)
    return wf


def _env(mark: str) -> dict:
    return {**os.environ, "GPULAB_HOST": HOST, "GPULAB_GPU_POOL": "", "GPULAB_TEST_MARK": mark}




def _wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _interrupt(wf, target: str, worker: str, how: str, mark: str) -> None:
    """Start Snakemake on ``target``, wait until ``worker`` runs, deliver ``how``, then require that
    no process of the run is left within a bounded time."""
    log = open(wf / f"interrupted-{how}.log", "w")
    sm = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", target], cwd=wf,
                          env={**_env(mark), "GPULAB_SLOT_DIR": str(wf / ".slots")},
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Ranks that cannot react (blocked in a collective) are tests/test_lifetime.py's part.
        _wait_for(lambda: [p for p in marked_processes(mark) if worker in " ".join(p.info["cmdline"])], 240,
                  f"{worker} to start")
        if how == "SIGINT":  # Ctrl-C: the terminal signals the whole foreground process group
            os.killpg(sm.pid, signal.SIGINT)
        else:
            sm.send_signal(getattr(signal, how))
        sm.wait(timeout=120)
        left = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = marked_processes(mark)
            if not left:
                break
            time.sleep(0.5)
        assert not left, f"after {how}: still running: {[' '.join(p.info['cmdline'])[:120] for p in left]}"
    finally:
        kill_marked(mark)  # never leak processes into the rest of the suite
        if sm.poll() is None:
            sm.kill()
        log.close()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupted_run_leaves_nothing_and_a_plain_rerun_finishes(tmp_path, how):
    wf = _tiny_workflow(tmp_path)
    target, worker = TARGETS["gemm"]
    mark = uuid.uuid4().hex
    _interrupt(wf, target, worker, how, mark)
    # A plain run, as `make run` would start it (the default profile must do the rest).
    p = snakemake(wf, "--cores", "2", target, env=_env(mark))
    assert (wf / target).exists(), p.stderr[-3000:]
    assert planned_rules(wf, target, env=_env(mark)) == {}
    assert not marked_processes(mark)


@pytest.mark.parametrize("stage,variant", [("collectives", "default"), ("train", "tensor")])
def test_ctrl_c_during_a_multi_process_stage_leaves_no_process(tmp_path, stage, variant):
    """The job's command as its rule runs it (slot holder -> stage script -> torchrun -> ranks),
    without Snakemake's start-up; the gemm runs above cover Snakemake's part."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg.setdefault(stage, {}).update(TINY.get(stage, {}))
    cfg["train"].update({"tensor_batches": [4], "warmup": 0, "repeats": 1})
    # Work that outlasts the interrupt: the tiny sizes finish between seeing a rank and signalling.
    cfg.setdefault("collectives", {}).update({"sizes_bytes": [1 << 20], "repeats": 500, "iters": 20})
    cfg["train"].update({"repeats": 500})
    extra = []
    if stage == "train":
        from sklearn.datasets import load_digits

        from gpulab.data.api import write_training_set

        d = load_digits()
        write_training_set(tmp_path / "digits.h5", (d.images[:64] / 16.0).astype("float32")[:, None],
                           d.target[:64])
        extra = ["--data", str(tmp_path / "digits.h5")]
    payload = json.dumps({"stage": cfg[stage], "devices": {"backend": "cpu", "cpu_devices": 2}})
    mark = uuid.uuid4().hex
    job = subprocess.Popen(
        [sys.executable, "-m", "gpulab.slots", "--gpus", "0", "--", sys.executable,
         str(REPO / "scripts" / f"{stage}.py"), "--config-json", payload, "--variant", variant,
         "--out", str(tmp_path / "out.h5"), *extra],
        env={**_env(mark), "GPULAB_SLOT_DIR": str(tmp_path)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: [p for p in marked_processes(mark) if f"gpulab.{stage}.worker" in " ".join(p.info["cmdline"])],
                  240, f"{stage} ranks to start")
        os.killpg(job.pid, signal.SIGINT)
        assert job.wait(timeout=60) != 0
        left = _wait_for(lambda: not marked_processes(mark) or None, 20, "every process of the job to end")
        assert left is True
    finally:
        kill_marked(mark)
