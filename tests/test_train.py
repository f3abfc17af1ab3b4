"""Training stage: real (tiny) training on CPU virtual devices, gloo ranks for DDP/PP/TP."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import fixtures_on_path, stage_context, stage_settings
from gpulab import config as cfgmod
from gpulab import launch, outcomes, results
from gpulab.train import data, loop, models, run, tables

REPO = Path(__file__).resolve().parents[1]

TINY = {
    "models": ["cnn", "mlp"], "mlp_hidden": [32], "warmup": 1, "repeats": 2,
    "batch_sizes": [16, 32], "curve_batch": 32, "curve_epochs": 2, "freeze_after_steps": 5,
    "global_batches": [32], "per_device_batch": 16, "bucket_cap_mb": [25, 1],
    "comm_hooks": ["none", "fp16", "powersgd"], "lr_warmup_steps": 4, "equivalence_steps": 3,
    "equivalence_batch": 8, "gpt": {"vocab": 16, "seq_len": 8, "d_model": 16, "n_heads": 2, "n_layers": 2},
    "pipeline_batch": 8, "microbatches": [1, 2], "tensor_batches": [4], "lr": 0.1,
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The in-process variant on one thread: the gloo ranks beside it need the other core."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """scikit-learn's digits (ships with the package) in the data stage's training-set format."""
    from sklearn.datasets import load_digits

    from gpulab.data.api import write_training_set

    d = load_digits()
    path = tmp_path_factory.mktemp("data") / "digits.h5"
    write_training_set(path, (d.images[:640] / 16.0).astype(np.float32)[:, None], d.target[:640])
    return path


def _run(variant, out_dir, digits, cfg=TINY, cpu_devices=2) -> Path:
    ctx = stage_context("train", variant, cfg, {"backend": "cpu", "cpu_devices": cpu_devices},
                        out_dir / f"{variant}.h5", {"data": str(digits)})
    return results.write(run(ctx), ctx.out)


@pytest.fixture(scope="module")
def stage(tmp_path_factory, digits) -> dict[str, Path]:
    """Every variant once, on two CPU virtual devices (gloo ranks)."""
    out = tmp_path_factory.mktemp("train")
    return {v: _run(v, out, digits) for v in ("single", "ddp", "pipeline", "tensor")}


def _checks_pass(path):
    chk = results.read_table(path, "checks")
    assert len(chk) and (chk["verdict"] == "pass").all(), chk.to_string()
    a = results.read_attrs(path)
    assert a["verdict"] == "pass" and not {"verified", "all_verified"} & set(a)
    return chk


@pytest.mark.slow
def test_single_variant_trains_and_records_every_strategy(stage):
    p = stage["single"]
    tp = results.read_table(p, "throughput")
    assert set(tp["strategy"]) == {"single", "data_parallel", "naive_mp", "freeze",
                                   "offload_activations", "offload_params"}
    assert (tp["samples_per_s"] > 0).all() and (tp["step_s_min"] <= tp["step_s_median"]).all()
    assert tp.attrs["units"]["samples_per_s"] == "samples/s" and tp.attrs["units"]["data_s"] == "s"
    phases = tp[["data_s", "forward_s", "backward_s", "optimizer_s"]].sum(axis=1)
    assert np.allclose(phases, tp["step_s_median"], rtol=0.5)  # median of sums vs sum of medians
    dp = tp[tp["strategy"] == "data_parallel"]
    assert dp["note"].str.contains("no CUDA device").all()
    assert "DataParallel" in results.read_attrs(p)["data_parallel_note"]
    _checks_pass(p)
    curve = results.read_table(p, "loss_curve")
    mlp = curve[(curve["model"] == "mlp") & (curve["strategy"] == "single")]["loss"].to_numpy()
    assert mlp[-5:].mean() < mlp[:5].mean() - 0.3  # it really learns the digits


@pytest.mark.slow
def test_single_variant_records_the_energy_of_a_training_step(tmp_path, digits, monkeypatch):
    """The single variant's energy table: one row per model, not applicable (with the reason)
    without a meter, J/sample with one; the timed training is the same either way; findings,
    the energy figure and the export pick the rows up."""
    import pandas as pd
    from test_energy import WallMeter

    from gpulab import energy, export, findings
    from gpulab.report import energy as energy_figure
    from gpulab.kit.html import Figures

    small = {**TINY, "batch_sizes": [16], "repeats": 1, "curve_epochs": 1}
    monkeypatch.setattr(energy, "torch_meter", lambda d: (None, "no RAPL domains under x"))
    p0 = _run("single", tmp_path / "none", digits, small)
    na = results.read_table(p0, "energy")
    assert list(na["operation"].str.split(",").str[0]) == ["training step cnn", "training step mlp"]
    assert (na["note"] == "not_applicable: no RAPL domains under x").all()
    assert not na["resolved"].any()

    monkeypatch.setattr(energy, "torch_meter", lambda d: (WallMeter(), ""))  # 100 W, real clock
    p1 = _run("single", tmp_path / "meter", digits, small)
    e = results.read_table(p1, "energy")
    assert len(e) == 2 and e["resolved"].all() and (e["device"] == "cpu").all()
    assert (e["duration_s"] >= 1.0).all() and (e["work"] == e["iterations"] * 16).all()
    assert np.allclose(e["per_op"], e["energy_J"] / (e["iterations"] * 16))
    assert np.allclose(e["avg_W"], 100.0, rtol=0.05) and set(e["per_op_unit"]) == {"J/sample"}
    u = e.attrs["units"]
    assert (u["energy_J"], u["avg_W"], u["duration_s"], u["iterations"]) == ("J", "W", "s", "count")
    # The energy steps come after the timed sweep, on fresh models: the training is untouched.
    for table in ("loss_curve", "throughput"):
        cols = ["model", "strategy", "loss" if table == "loss_curve" else "final_loss"]
        pd.testing.assert_frame_equal(results.read_table(p0, table)[cols],
                                      results.read_table(p1, table)[cols])

    found, _ = findings.derive([p1], stages=["train"])
    stated = [f.statement for f in found if f.rule == "train.train_energy"]
    assert len(stated) == 2 and all("J/sample" in s and "samples/J" in s for s in stated)
    figs = Figures()
    assert "training step" in energy_figure.render([p1], figs) and figs.figure_no == 1
    tidy = export.tidy([p1])
    units = dict(tidy[tidy["table"] == "energy"][["metric", "unit"]].drop_duplicates().values)
    assert units == {"work": "sample", "duration_s": "s", "energy_J": "J", "avg_W": "W",
                     "throughput": "samples/s", "efficiency": "samples/J", "per_op": "J/sample"}


@pytest.mark.slow
def test_freezing_stops_updates_of_the_feature_layers(digits):
    cfg = stage_settings("train", **TINY)
    ds = data.open_digits(digits)
    dev = [torch.device("cpu")]
    from gpulab.train import single

    model, opt, dev0, _, _ = single.make(cfg, "cnn", "freeze", dev, 0)
    before = [q.clone() for q in model.seq1.parameters()]
    head = [q.clone() for q in model.seq2.parameters()]
    loop.timed_step(model, opt, data.EpochBatches(ds, 16), dev0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.seq1.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(head, model.seq2.parameters()))


@pytest.mark.slow
def test_ddp_matches_single_device_and_sweeps_every_axis(stage):
    p = stage["ddp"]
    chk = _checks_pass(p)
    eq = chk[chk["check"].str.startswith("ddp(2) == single device")]
    assert len(eq) == 2 and (eq["value"] < 1e-9).all()
    assert chk["check"].str.contains("set_epoch").any()
    agg = results.read_table(p, "ddp")
    comm = agg[agg["sweep"] == "comm"]
    assert set(zip(comm["bucket_cap_mb"], comm["comm_hook"])) == {
        (b, h) for b in (25, 1) for h in ("none", "fp16", "powersgd")} and (comm["devices"] == 2).all()
    for sweep in ("strong", "weak"):
        s = agg[(agg["sweep"] == sweep) & (agg["model"] == "mlp")].set_index("devices")
        assert s.loc[1, "efficiency"] == pytest.approx(1.0) and np.isfinite(s.loc[2, "efficiency"])
    strong = agg[agg["sweep"] == "strong"]
    assert (strong["global_batch"] == 32).all() and set(strong["local_batch"]) == {32, 16}
    ranks = results.read_table(p, "ddp_ranks")
    assert set(ranks["rank"]) == {0, 1}
    for sweep in ("strong", "weak"):
        s = agg[(agg["sweep"] == sweep) & (agg["model"] == "mlp")].set_index("devices")
        assert s.loc[2, "speedup"] == pytest.approx(2 * s.loc[2, "efficiency"])
    bars = results.read_table(p, "bars")
    assert list(bars.columns) == outcomes.BAR_COLUMNS and (bars["verdict"] == "not_applicable").all()
    assert bars["note"].str.contains("CPU virtual devices").all()


@pytest.mark.slow
def test_lr_scaling_rule_with_warmup(stage):
    lr = results.read_table(stage["ddp"], "lr_scaling")
    w = lr[lr["setting"] == "lr x N + warm-up"].sort_values("step")["lr"].to_numpy()
    assert w[0] == pytest.approx(0.1) and w[4:] == pytest.approx(0.2) and (np.diff(w) >= 0).all()
    assert (lr[lr["setting"] == "base lr"]["lr"] == 0.1).all()
    assert np.isfinite(lr["loss"]).all()


@pytest.mark.slow
def test_pipeline_matches_unsplit_model_and_measures_the_bubble(stage):
    p = stage["pipeline"]
    _checks_pass(p)
    pl = results.read_table(p, "pipeline")
    skipped = pl[(pl["schedule"] == "1f1b") & (pl["microbatches"] == 1)]
    assert skipped["note"].str.contains("m >= p").all()
    ran = pl[pl["note"] == ""]
    assert len(ran) == 3 and np.isfinite(ran["bubble_measured"]).all()
    assert ran["bubble_gpipe"].tolist() == pytest.approx(
        [loop.gpipe_bubble(2, m) for m in ran["microbatches"]])
    # Every rank's idle share is a fraction of its step, and under GPipe the ranks' mean idle share
    # (the table's bubble, the bar's figure) is at least the schedule's own (p-1)/(m+p-1), less
    # only by timer noise. Not each rank's: the last stage also holds the head and the loss, so it
    # idles less than (p-1)/(m+p-1) by design (0.37 at m=1 in a CI run, its peer 0.56).
    ranks = results.read_table(p, "pipeline_ranks")
    ranks = ranks[ranks["note"] == ""]
    assert ((ranks["bubble_measured"] >= 0) & (ranks["bubble_measured"] < 1)).all(), ranks
    assert (ranks["busy_s"] <= ranks["step_s_median"]).all()
    gp = ran[ran["schedule"] == "gpipe"]
    assert len(gp) == 2 and (gp["bubble_measured"] >= gp["bubble_gpipe"] - 0.1).all(), gp
    assert (results.read_table(p, "bars")["verdict"] == "not_applicable").all()


def test_a_rank_busy_for_every_step_is_never_busier_than_its_median_step():
    """Two timed steps (the tests' repeats): the step median is their mean, so the busy median must
    be too. The upper of the two (the convention before) read 6.2 ms busy in a 5.9 ms median step
    in one CPU run."""
    from gpulab.train.pipeline import busy_and_bubble

    steps, busy = [0.004, 0.008], [0.003, 0.0075]  # each step busy for less than itself
    busy_med, bubble = busy_and_bubble(busy, steps)
    assert busy_med <= np.median(steps) and busy_med == pytest.approx(0.00525)
    assert bubble == pytest.approx(np.median([1 - 0.003 / 0.004, 1 - 0.0075 / 0.008]))
    assert sorted(busy)[1] > np.median(steps)  # what the upper-middle convention reported



@pytest.mark.slow
def test_tensor_parallel_matches_unsplit_and_shards_parameters(stage):
    p = stage["tensor"]
    _checks_pass(p)
    t = results.read_table(p, "tensor").set_index("mode")
    assert t.loc["tensor_parallel", "params_local"] < t.loc["unsplit", "params_local"]
    assert t.loc["unsplit", "speedup"] == pytest.approx(1.0)


@pytest.mark.slow
def test_one_device_still_runs_model_parallel_code_paths(tmp_path, digits):
    cfg = {**TINY, "schedules": ["gpipe"], "microbatches": [2]}
    p = _run("pipeline", tmp_path, digits, cfg, cpu_devices=1)
    pl = results.read_table(p, "pipeline")
    assert pl["stages"].tolist() == [1] and pl["bubble_gpipe"].tolist() == [0.0]
    _checks_pass(p)


def _imports_payload(digits, mode: str) -> dict:
    """A train worker payload for ``mode`` that reaches every import of the strategy (all comm hooks)
    at the least work."""
    from gpulab.train.settings import Settings

    cfg = {**TINY, "models": ["mlp"], "comm_hooks": ["none", "fp16", "powersgd"],
           "bucket_cap_mb": [25], "schedules": ["gpipe"], "microbatches": [2], "curve_epochs": 1}
    return {"mode": mode, "cfg": Settings.from_section(cfgmod.validate_section("train", cfg)).as_section(),
            "data": str(digits), "backend": "auto"}


def _launch_train_imports(payload: dict, nproc: int):
    """The train worker's ranks, each reporting the torch modules it imported after the fork
    (tests/fixtures/launch/train_imports.py)."""
    return launch.run_workers("train_imports", payload, nproc=nproc, env=fixtures_on_path("launch"),
                              timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "pipeline", "tensor"])
def test_a_strategys_ranks_find_its_torch_modules_imported_before_the_fork(digits, mode):
    """gpulab.forkrun imports what a strategy's ranks need (gpulab.train.worker.preload) once,
    before it forks them: 0.5-1.1 CPU-s per rank each (torch._dynamo, DTensor, pipelining). A torch
    release that imports something new on first use shows up here by name."""
    ranks = _launch_train_imports(_imports_payload(digits, mode), nproc=2)
    assert [r["late_torch_imports"] for r in ranks] == [[], []], ranks


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "pipeline", "tensor"])
def test_a_strategys_preload_leaves_cuda_uninitialised_and_its_ranks_run_on_the_gpus(digits, mode, tmp_path):
    """On a CUDA host the fork needs CUDA untouched in the parent: the preload of each strategy
    (gpulab.forkrun._preload, which stops a launch whose imports initialised it) leaves it so, and
    the forked ranks then train on the GPUs with nothing left to import."""
    import json

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    payload = _imports_payload(digits, mode)
    f = tmp_path / "payload.json"
    f.write_text(json.dumps(payload))
    probe = ("import torch; from gpulab import forkrun; "
             f"forkrun._preload('gpulab.train.worker', ['--payload', {str(f)!r}]); "
             "print(torch.cuda.is_initialized())")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.split() == ["False"], p.stdout + p.stderr
    n = torch.cuda.device_count()
    ranks = _launch_train_imports(payload, nproc=n)
    assert [r["late_torch_imports"] for r in ranks] == [[]] * n, ranks
    assert all(r["device"].startswith("cuda") for r in ranks.placement), ranks.placement


def test_formulas():
    assert loop.gpipe_bubble(4, 4) == pytest.approx(3 / 7)
    assert tables.scaling_efficiency(300.0, 4, 100.0) == pytest.approx(0.75)
    assert loop.lr_at(0, 0.1, 4, True, 10) == pytest.approx(0.1)
    assert loop.lr_at(5, 0.1, 4, True, 10) == pytest.approx(0.25)
    assert loop.lr_at(10, 0.1, 4, True, 10) == pytest.approx(0.4)
    assert loop.lr_at(3, 0.1, 4, False, 10) == pytest.approx(0.1)
    assert models.split_points(6, 4) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    with pytest.raises(ValueError, match="cannot split 3 layers into 4"):
        models.split_points(3, 4)


def test_global_batch_is_the_union_of_rank_shards():
    from torch.utils.data import DistributedSampler

    idx = data.global_batch_indices(100, 4, 5, step=2, seed=3)
    shards = []
    for r in range(4):
        s = DistributedSampler(range(100), num_replicas=4, rank=r, seed=3, drop_last=True)
        s.set_epoch(0)
        shards += list(s)[10:15]
    assert idx == shards and len(set(idx)) == 20


def test_models_split_and_shard_consistently():
    x = torch.rand(4, 1, 8, 8)
    loop.seed_everything(0)
    m = models.MyNet()
    ref = m(x)
    assert torch.equal(models.NaiveModelParallel(m, [torch.device("cpu")] * 2)(x), ref)
    g = models.TinyGPT(models.GPTConfig(vocab=16, seq_len=8, d_model=16, n_heads=2, n_layers=3))
    stages = [models.pipeline_stage_module(g, s, 2) for s in range(2)]
    tok = torch.randint(16, (2, 8))
    assert torch.allclose(stages[1](stages[0](tok)), g(tok))
    plan = models.tensor_parallel_plan(g)
    assert len(plan) == 3 * 6 and "layers.1.attn.q" in plan and "layers.3.fc2" in plan


@pytest.mark.slow
def test_report_section_renders_every_variant(stage):
    from gpulab.kit.html import Figures
    from gpulab.train import section

    figs = Figures()
    html = section.render(list(stage.values()), figs)
    assert figs.figure_no >= 6 and figs.table_no >= 5
    assert "Pipeline bubble" in html and "CPU virtual devices" in html and "DDP scaling" in html
    lines = section.headlines(list(stage.values()))
    assert 1 <= len(lines) <= 3 and any("DDP matches single-device" in s for s in lines)
    assert "(p&minus;1)/(m+p&minus;1)" in section.METHODS and section.TITLE


@pytest.mark.slow
def test_bad_inputs_fail_clearly(tmp_path, digits):
    with pytest.raises(cfgmod.ConfigError, match="pipeline_batch=10 is not divisible by "
                                                 r"train.microbatches \[4\]"):
        _run("pipeline", tmp_path, digits, {**TINY, "pipeline_batch": 10, "microbatches": [2, 4]})
    with pytest.raises(cfgmod.ConfigError, match="comm_hooks"):
        _run("ddp", tmp_path, digits, {**TINY, "comm_hooks": ["gzip"]})
    with pytest.raises(SystemExit, match="unknown variant 'dp'"):
        _run("dp", tmp_path, digits)
    with pytest.raises(ValueError, match="too few for a local batch of 4096"):
        _run("single", tmp_path, digits, {**TINY, "batch_sizes": [4096]})
    with pytest.raises(Exception, match="does not exist"):
        _run("single", tmp_path, tmp_path / "missing.h5")
    with pytest.raises(ValueError, match="must be a multiple of gpt.n_heads"):
        models.GPTConfig(vocab=16, seq_len=8, d_model=10, n_heads=4, n_layers=2)


@pytest.mark.slow
def test_script_help():
    out = subprocess.run([sys.executable, str(REPO / "scripts/train.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--variant" in out and "--data" in out and "pipeline" in out


def _ddp_agg(speedup_at_2: float) -> "pd.DataFrame":
    import pandas as pd

    rows = []
    for sweep, local in (("strong", (32, 16)), ("weak", (32, 32))):
        for devices, lb in zip((1, 2), local):
            t = 1.0 if devices == 1 else (32 * 2 if sweep == "weak" else 32) / (32 * speedup_at_2)
            rows.append({"sweep": sweep, "model": "mlp", "devices": devices, "local_batch": lb,
                         "global_batch": lb * devices, "bucket_cap_mb": 25, "comm_hook": "none",
                         "step_s_median": t, "rank": 0, "peak_mem_bytes": 0.0})
    return tables.ddp_table(rows)


def test_ddp_bars_are_speedups_against_one_device_and_fail_when_slow():
    good = {b.bar.split()[1]: b for b in tables.ddp_bars(_ddp_agg(1.9), "cuda", 2)}
    assert good["strong-scaling"].verdict == "pass" and good["weak-scaling"].verdict == "pass"
    assert good["strong-scaling"].measured == pytest.approx(1.9) and good["strong-scaling"].reference == 2
    assert "same work" in good["strong-scaling"].source
    slow = {b.bar.split()[1]: b for b in tables.ddp_bars(_ddp_agg(1.1), "cuda", 2)}  # a slow link
    assert slow["strong-scaling"].verdict == "fail" and slow["weak-scaling"].verdict == "fail"
    assert slow["strong-scaling"].ratio == pytest.approx(0.55)
    assert {b.verdict for b in tables.ddp_bars(_ddp_agg(1.9), "cpu", 2)} == {"not_applicable"}


def test_model_parallel_bars_fail_on_a_degraded_measurement():
    rows = [{"mode": m, "devices": d, "global_batch": 16, "step_s_median": t, "rank": 0,
             "params_local": 10, "peak_mem_bytes": 0.0}
            for m, d, t in (("unsplit", 1, 1.0), ("tensor_parallel", 2, 0.6))]
    checks = [{"grad_rel_err": 0.0, "loss_rel_err": 0.0}]
    cfg = stage_settings("train", float32_tolerance=1e-4)
    _, _, [ok] = tables.tensor_tables(rows, checks, cfg, "cuda", 2)
    assert ok.verdict == "pass"
    rows[1]["step_s_median"] = 1.5  # slower than the unsplit model
    _, _, [slow] = tables.tensor_tables(rows, checks, cfg, "cuda", 2)
    assert slow.verdict == "fail"
    assert tables._bubble_bar("b", 0.45, 0.2, 0.10, "").verdict == "fail"
    assert tables._bubble_bar("b", 0.25, 0.2, 0.10, "").verdict == "pass"


@pytest.mark.slow
def test_failed_and_crashed_checks_fail_the_variant(tmp_path, digits, monkeypatch):

    def crash(*args, **kwargs):
        raise launch.LaunchError("rank 1 exited with signal 9")

    monkeypatch.setattr(launch, "run_workers", crash)
    p = _run("tensor", tmp_path, digits)
    a = results.read_attrs(p)
    assert a["verdict"] == "fail" and "1 crashed" in a["verdict_summary"]


def test_single_process_timers_wait_for_every_device_used(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append(d))
    devs = [torch.device("cuda", 1), torch.device("cuda", 0), torch.device("cuda", 1)]
    loop.sync_fn(devs)()
    assert synced == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert loop.sync_fn([torch.device("cpu")]) is None


@pytest.mark.slow
def test_tensor_parallel_on_three_devices_uses_the_largest_divisor_of_the_heads(tmp_path, digits):
    """n_heads=2 over 3 devices: 2 ranks, and the third device is recorded as not applicable."""
    cfg = {**TINY, "tensor_batches": [4]}
    p = _run("tensor", tmp_path, digits, cfg, cpu_devices=3)
    _checks_pass(p)
    assert results.read_attrs(p)["parallel_degree"] == 2
    na = results.read_table(p, "not_applicable")
    assert na["reason"].str.contains("n_heads=2 splits evenly over 2 of the 3 devices").all()
    assert set(results.read_table(p, "tensor")["devices"]) == {1, 2}


@pytest.mark.parametrize("n, tensor, pipeline", [(1, 1, 1), (2, 2, 2), (3, 2, 3), (4, 4, 4),
                                                  (5, 4, 4), (6, 4, 4), (7, 4, 4), (8, 4, 4)])
def test_every_device_count_gets_the_largest_valid_degree_and_says_why_it_is_less(n, tensor, pipeline):
    from gpulab.train import parallel_degree

    gpt = stage_settings("train", gpt={"n_layers": 2, "n_heads": 4})  # embedding + 2 blocks + head
    for variant, want in (("tensor", tensor), ("pipeline", pipeline)):
        got, why = parallel_degree(variant, gpt, n)
        assert got == want, (variant, n, got)
        assert (why == "") == (want == n), why
        assert not why or f"of the {n} devices" in why or f"on {n} devices" in why


def test_config_that_can_never_work_is_rejected_before_running():
    from gpulab import config as cfgmod
    from gpulab.train import check_config, parallel_degree

    with pytest.raises(cfgmod.ConfigError, match="d_model=30 is not a multiple of train.gpt.n_heads=4"):
        check_config(cfgmod.validate_section("train", {"gpt": {"d_model": 30, "n_heads": 4}}))
    with pytest.raises(cfgmod.ConfigError, match="pipeline_batch=6 is not divisible by train.microbatches"):
        check_config(cfgmod.validate_section("train", {"pipeline_batch": 6, "microbatches": [4]}))
    assert parallel_degree("pipeline", stage_settings("train", gpt={"n_layers": 2}), 6)[0] == 4


def test_ddp_bars_judge_a_fixed_model_and_batch_not_the_best():
    # issue 24: the bars took the most efficient of every model and batch; a second, faster
    # model must not turn the first model's slow scaling into a pass.
    import pandas as pd

    rows = []
    for model, s2 in (("cnn", 1.1), ("mlp", 1.95)):
        for sweep, local in (("strong", (32, 16)), ("weak", (32, 32))):
            for devices, lb in zip((1, 2), local):
                t = 1.0 if devices == 1 else (32 * 2 if sweep == "weak" else 32) / (32 * s2)
                rows.append({"sweep": sweep, "model": model, "devices": devices, "local_batch": lb,
                             "global_batch": lb * devices, "bucket_cap_mb": 25,
                             "comm_hook": "none", "step_s_median": t, "rank": 0,
                             "peak_mem_bytes": 0.0})
    agg = tables.ddp_table(rows)
    got = {b.bar.split()[1]: b for b in tables.ddp_bars(agg, "cuda", 2, "cnn")}
    assert got["strong-scaling"].verdict == "fail" and "cnn" in got["strong-scaling"].note
    assert got["weak-scaling"].verdict == "fail"
    assert {b.verdict for b in tables.ddp_bars(agg, "cuda", 2, "mlp")} == {"pass"}
    assert isinstance(agg, pd.DataFrame)


def test_pipeline_bubble_row_stores_the_difference_it_judges():
    # issue 24: a passing row read "ratio 1.1 <= 0.10" (measured / formula against an absolute
    # bound on the difference).
    bar = tables._bubble_bar("b", 0.22, 0.2, 0.10, "")
    assert bar.verdict == "pass" and bar.ratio == pytest.approx(0.02)
    assert bar.measured == pytest.approx(0.02) and bar.reference == 0.2
    assert "measured bubble 0.22" in bar.note
    assert tables._bubble_bar("b", 0.45, 0.2, 0.10, "").ratio == pytest.approx(0.25)
