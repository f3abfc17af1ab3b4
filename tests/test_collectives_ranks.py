"""Collectives stage over real gloo processes (torchrun): every case exact on 4 ranks, and the
stage's result file."""
import json

import pytest

from conftest import stage_context
from gpulab import results


def _ctx(tmp_path, variant):
    # 4 ranks: the binary tree has an inner node (rank 1 -> 3). 4 B = one element, so three of the
    # four ring chunks are empty and are skipped on both ends; 40004 B = 10001 elements gives uneven
    # ring chunks, and 1000-byte slices make every pipeline several slices deep.
    cfg = {"sizes_bytes": [4, 40004], "repeats": 2, "iters": 1, "warmup": 0, "slice_bytes": 1000,
           "variants": ["default", "ring", "tree", "no_p2p"]}
    return stage_context("collectives", variant, cfg, {"backend": "cpu", "cpu_devices": 4},
                         tmp_path / f"{variant}.h5")


@pytest.mark.slow
def test_stage_result_default_variant(tmp_path):
    from gpulab.collectives import run

    ctx = _ctx(tmp_path, "default")
    path = results.write(run(ctx), ctx.out)
    a = results.read_attrs(path)
    assert a["verdict"] == "pass" and a["world_size"] == 4 and a["device_kind"] == "cpu"
    assert "verified" not in a
    checks = results.read_table(path, "checks")
    assert len(checks) == 2 * 7 + 3 * 2 and set(checks["verdict"]) == {"pass"}
    assert (checks["value"] == 0).all()
    assert a["env"]["NCCL_NVLS_ENABLE"] == "0"
    lib = results.read_table(path, "library")
    assert lib.attrs["units"]["busbw_GBps"] == "GB/s" and lib["verified"].all()
    assert len(lib) == 2 * 7
    ar = lib[lib["op"] == "all_reduce"].iloc[-1]
    assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"] * 2 * (4 - 1) / 4)
    ag = lib[lib["op"] == "all_gather"].iloc[-1]  # 40004 B = 10001 elements -> 4 x 2500
    assert ag["count"] == 2500 and ag["bytes"] == 40000
    assert (lib["wrong"] == 0).all()
    algs = results.read_table(path, "allreduce_algorithms")
    assert set(algs["algorithm"]) == {"library", "ring", "tree", "param_server"}
    assert (algs["wrong"] == 0).all()
    assert (algs[algs["bytes"] == 40004].dropna(subset=["slices"])["slices"] > 1).all()
    samples = results.read_table(path, "samples")
    assert len(samples) == 2 * (len(lib) + 3 * 2) and (samples["time_s"] > 0).all()
    bars = results.read_table(path, "bars")
    assert len(bars) == 3 and set(bars["verdict"]) == {"not_applicable"}
    assert bars["measured"].notna().all() and bars["note"].str.contains("CPU").all()
    variants = results.read_table(path, "variants").set_index("variant")
    # A variant that does not apply here is a not_applicable row with its reason, not a row of
    # the variants table whose free-text status the report parses back.
    assert variants.loc["default", "result"] == "this result" and "tree" not in variants.index
    na = results.read_table(path, "not_applicable").set_index("what")
    assert any(w.startswith("path variant tree") and "gloo" in na.loc[w, "reason"]
               for w in na.index), na
    _check_report_section([path, results.write(run(_ctx(tmp_path, "tree")), tmp_path / "tree.h5")])


def _check_report_section(files):
    from gpulab.kit.html import Figures
    from gpulab.collectives import section

    figs = Figures()
    html = section.render(files, figs)
    assert figs.figure_no == 2 and "Bars, measured in the same job" in html
    assert "not_applicable" in html and "Not measured here, and why" in html
    assert "Verification: 20 of 20 collective results exact" in html
    assert "process models differ" in section.METHODS
    lines = section.headlines(files)
    assert lines and "busbw" in lines[0] and "4 gloo ranks on CPU" in lines[0]
    refs = section.references(files)
    assert list(refs["source"]) == ["library all-reduce, same run"]
    assert refs["fraction"].iloc[0] > 0 and "2(n&minus;1)/n" in section.METHODS


def test_stage_nccl_variant_is_not_applicable_on_cpu(tmp_path):
    from gpulab.collectives import run

    ctx = _ctx(tmp_path, "tree")
    path = results.write(run(ctx), ctx.out)
    a = results.read_attrs(path)
    assert a["applicable"] is False and "NCCL_ALGO=Tree" in a["note"]
    # Nothing was checked: the verdict is not_applicable, and nothing claims "verified".
    assert a["verdict"] == "not_applicable" and "verified" not in a
    assert a["verdict_counts"]["checks"] == 0
    na = results.read_table(path, "not_applicable")
    assert na["what"].iloc[0] == "variant tree" and len(na) == 1 + 5 * 2
    assert na["reason"].str.contains("NCCL").all()
    assert "library" not in results.list_contents(path)["tables"]


def test_stage_rejects_bad_config(tmp_path):
    from gpulab.collectives import run
    from gpulab.stage import stage_main

    # The section is validated before the stage runs (by the workflow, or here for a script run by
    # hand), so run() never sees an unknown op.
    payload = json.dumps({"stage": {"ops": ["all_reduce", "gather"]}})
    with pytest.raises(SystemExit, match=r"(?s)collectives.*'collectives\.ops\[1\]'.*gather"):
        stage_main("collectives", run, argv=["--config-json", payload, "--out", str(tmp_path / "x.h5")])
    ctx = _ctx(tmp_path, "rings")
    with pytest.raises(ValueError, match="unknown collectives variant 'rings'"):
        run(ctx)
    json.dumps(ctx.config)  # the context stays plain data


@pytest.mark.slow
def test_a_wrong_element_or_a_crashed_launch_fails_the_stage(tmp_path, monkeypatch):
    import gpulab.collectives as stage
    from gpulab import launch

    real = launch.run_workers

    def corrupt(*args, **kwargs):
        ranks = real(*args, **kwargs)
        ranks[1]["rows"][0]["wrong"] = 3  # one rank saw 3 wrong elements in its first case
        return ranks

    monkeypatch.setattr(stage.launch, "run_workers", corrupt)
    ctx = _ctx(tmp_path, "default")
    ctx.config.update(sizes_bytes=[40004], algorithms=["ring"], ops=["all_reduce"])
    a = results.read_attrs(results.write(stage.run(ctx), ctx.out))
    assert a["verdict"] == "fail" and "1 failed" in a["verdict_summary"]

    def crash(*args, **kwargs):
        raise launch.LaunchError("rank 2 exited with signal 6")

    monkeypatch.setattr(stage.launch, "run_workers", crash)
    ctx = _ctx(tmp_path, "default")
    path = results.write(stage.run(ctx), tmp_path / "crash.h5")
    a = results.read_attrs(path)
    assert a["verdict"] == "fail" and "1 crashed" in a["verdict_summary"]


@pytest.mark.slow
def test_library_only_config_still_has_bars(tmp_path):
    # issue 24: the health preset configures no hand-written algorithm, and its collectives result
    # had no bar at all; the bars are now built from the library table.
    from gpulab.collectives import run

    cfg = {"sizes_bytes": [4096], "repeats": 2, "iters": 1, "warmup": 0, "algorithms": [],
           "ops": ["all_reduce"], "variants": ["default"]}
    ctx = stage_context("collectives", "default", cfg, {"backend": "cpu", "cpu_devices": 2},
                        tmp_path / "health.h5")
    path = results.write(run(ctx), ctx.out)
    assert "allreduce_algorithms" not in results.list_contents(path)["tables"]
    bars = results.read_table(path, "bars")
    assert len(bars) == 3 and set(bars["verdict"]) == {"not_applicable"}
    assert bars["bar"].str.startswith("library all-reduce").sum() == 2
