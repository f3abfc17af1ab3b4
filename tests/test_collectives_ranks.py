"""Collectives stage over real gloo processes (torchrun): every case exact on 3 and 4 ranks, and the
stage's result file."""
import json

import pytest

from gpulab import launch, results
from gpulab.collectives import formulas, library
from gpulab.stage import StageContext


def _payload(**kw):
    p = {"backend": "gloo", "ops": list(formulas.OPS), "modes": list(library.MODES),
         "sizes_bytes": [8, 4004, 40004], "algorithms": list(formulas.HANDWRITTEN), "warmup": 0,
         "repeats": 1, "iters": 1, "seed": 5, "slice_bytes": 1000, "max_slices": 8}
    p.update(kw)
    return p


def _check_ranks(res, n, n_cases):
    assert [r["rank"] for r in res] == list(range(n))
    for r in res:
        assert r["world_size"] == n and r["backend"] == "gloo" and len(r["rows"]) == n_cases
        for row in r["rows"]:
            assert row["wrong"] == 0, row
            assert len(row["samples"]) == 1 and row["samples"][0] > 0


def test_four_ranks_every_collective_and_algorithm_is_exact():
    # 4 ranks: the binary tree has an inner node (rank 1 -> 3); odd sizes give uneven ring chunks,
    # 1000-byte slices make every pipeline several slices deep.
    res = launch.run_workers("gpulab.collectives.worker", _payload(), nproc=4, timeout=240)
    library_cases = sum(1 for op in formulas.OPS for m in library.MODES
                        if (op, m) not in library.UNSUPPORTED)
    _check_ranks(res, 4, 3 * library_cases + 3 * 3)
    deepest = [row for row in res[0]["rows"] if row["kind"] == "handwritten" and row["bytes"] == 40004]
    assert {row["op"] for row in deepest} == set(formulas.HANDWRITTEN)
    assert all(row["slices"] > 1 for row in deepest)


def _ctx(tmp_path, variant):
    # 3 ranks (not a power of two); 4 B = one element, so two of the three ring chunks are empty and
    # are skipped on both ends; 300-byte slices give uneven pipelines.
    cfg = {"sizes_bytes": [4, 39996], "repeats": 2, "iters": 1, "warmup": 0, "slice_bytes": 300,
           "variants": ["default", "ring", "tree", "no_p2p"]}
    return StageContext("collectives", variant, cfg, {"backend": "cpu", "cpu_devices": 3},
                        tmp_path / f"{variant}.h5")


def test_stage_result_default_variant(tmp_path):
    from gpulab.collectives import run

    ctx = _ctx(tmp_path, "default")
    path = results.write(run(ctx), ctx.out)
    a = results.read_attrs(path)
    assert a["verified"] is True and a["world_size"] == 3 and a["device_kind"] == "cpu"
    assert a["env"]["NCCL_NVLS_ENABLE"] == "0"
    lib = results.read_table(path, "library")
    assert lib.attrs["units"]["busbw_GBps"] == "GB/s" and lib["verified"].all()
    assert len(lib) == 2 * 7
    ar = lib[lib["op"] == "all_reduce"].iloc[-1]
    assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"] * 2 * (3 - 1) / 3)
    ag = lib[lib["op"] == "all_gather"].iloc[-1]  # 39996 B = 9999 elements = 3 x 3333
    assert ag["count"] == 3333 and ag["bytes"] == 39996
    algs = results.read_table(path, "allreduce_algorithms")
    assert set(algs["algorithm"]) == {"library", "ring", "tree", "param_server"}
    assert (algs["wrong"] == 0).all() and algs["slices"].max() > 1
    samples = results.read_table(path, "samples")
    assert len(samples) == 2 * (len(lib) + 3 * 2) and (samples["time_s"] > 0).all()
    bars = results.read_table(path, "bars")
    assert len(bars) == 2 and set(bars["passed"]) == {"not applicable"}
    assert bars["measured"].notna().all()
    variants = results.read_table(path, "variants").set_index("variant")
    assert variants.loc["default", "status"] == "this result"
    assert variants.loc["tree", "status"].startswith("not applicable")


def test_stage_nccl_variant_is_not_applicable_on_cpu(tmp_path):
    from gpulab.collectives import run

    ctx = _ctx(tmp_path, "tree")
    path = results.write(run(ctx), ctx.out)
    a = results.read_attrs(path)
    assert a["applicable"] is False and "NCCL_ALGO=Tree" in a["note"]
    cov = results.read_table(path, "coverage")
    assert cov["status"].str.startswith("not applicable").all()
    assert "library" not in results.list_contents(path)["tables"]


def test_stage_rejects_bad_config(tmp_path):
    from gpulab.collectives import run
    from gpulab.config import ConfigError

    ctx = _ctx(tmp_path, "default")
    ctx.config["ops"] = ["all_reduce", "gather"]
    with pytest.raises(ConfigError, match="ops"):
        run(ctx)
    with pytest.raises(ValueError, match="unknown collectives variant 'rings'"):
        run(_ctx(tmp_path, "rings"))
    json.dumps(ctx.config)  # the context stays plain data
