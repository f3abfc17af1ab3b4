"""Collectives stage, in one process: formulas, data, checks, topology, assembly, bars, parsing."""
import math
from pathlib import Path

import pytest
import torch

from gpulab import outcomes
from gpulab.collectives import assemble, data, formulas, handwritten, library, nccltests

FIX = Path(__file__).parent / "fixtures" / "collectives"


def test_bus_factors_are_nccl_tests():
    n = 4
    assert formulas.bus_factor("all_reduce", n) == pytest.approx(1.5)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert formulas.bus_factor(op, n) == pytest.approx(0.75)
    assert formulas.bus_factor("broadcast", n) == 1.0
    assert formulas.bus_factor("ring", n) == formulas.bus_factor("all_reduce", n)
    assert formulas.bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        formulas.bus_factor("gather", 2)


def test_shapes_round_counts_like_nccl_tests():
    ag = formulas.shape("all_gather", 2**20, 3)
    assert (ag.count, ag.total, ag.bytes) == (87381, 3 * 87381, 4 * 3 * 87381)
    assert formulas.shape("all_reduce", 8, 4).count == 2  # buffer length
    tiny = formulas.shape("reduce_scatter", 8, 4)  # at least one element per rank
    assert (tiny.count, tiny.bytes) == (1, 16)
    with pytest.raises(ValueError, match="positive"):
        formulas.shape("all_reduce", 0, 2)


def test_algbw_and_busbw():
    assert formulas.algbw(10**9, 0.5) == pytest.approx(2.0)
    assert formulas.busbw("all_reduce", 4, 10**9, 1.0) == pytest.approx(1.5)
    assert math.isnan(formulas.algbw(10, 0.0))


def test_patterns_are_consistent_and_exactly_summable():
    p = data.Patterns(seed=3, world_size=3, device=torch.device("cpu"))
    full = p.rank_buffer(1, data.PERIOD + 100)
    # the repetition is seamless and a window equals the same slice of the whole buffer
    assert torch.equal(full[data.PERIOD:], full[:100])
    assert torch.equal(p.rank_buffer(1, 100, start=data.PERIOD - 30), full[data.PERIOD - 30:data.PERIOD + 70])
    assert not torch.equal(p.rank_buffer(0, 1000), p.rank_buffer(1, 1000))
    assert p.of(0).abs().max() <= data.LIMIT and p.of(0).dtype == torch.float32
    s = sum(p.rank_buffer(r, 5000, start=7).double() for r in range(3))
    assert torch.equal(p.sum_buffer(5000, start=7).double(), s)


def test_compare_counts_wrong_elements():
    a = torch.arange(10.0)
    b = a.clone()
    assert data.compare(a, b) == 0
    b[3] += 1
    assert data.compare(a, b) == 1
    assert data.compare(a, a[:5]) == 10


def test_topologies_are_trees_rooted_at_zero():
    for make in (handwritten.binary_tree, handwritten.star):
        for n in (1, 2, 5, 8):
            parents = {r: make(r, n)[0] for r in range(n)}
            assert parents[0] is None
            for r in range(n):
                for c in make(r, n)[1]:
                    assert parents[c] == r
            assert sum(len(make(r, n)[1]) for r in range(n)) == n - 1


def test_num_slices():
    assert handwritten.num_slices(1000, 400, 8) == 8  # 10 wanted, capped
    assert handwritten.num_slices(1000, 1000, 8) == 4
    assert handwritten.num_slices(3, 1, 8) == 3  # never more slices than elements
    assert handwritten.num_slices(1, 10**9, 8) == 1


@pytest.fixture
def single_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_every_case_runs_and_its_check_catches_corruption(single_rank_group):
    p = data.Patterns(seed=1, world_size=1, device=torch.device("cpu"))
    cases = [library.make_case(op, mode, 4004, p, 0, 1) for op in formulas.OPS for mode in library.MODES]
    cases = [c for c in cases if c is not None]
    cases += [handwritten.make_case(a, 4004, p, 0, 1, 1000, 8) for a in formulas.HANDWRITTEN]
    assert len(cases) == 7 + 3
    for case in cases:
        case.restore()
        case.run()
        assert case.check() == 0, (case.op, case.mode)
        case.output.view(-1)[-1] += 1  # one wrong element
        assert case.check() == 1, (case.op, case.mode)


def test_unsupported_modes_are_explained():
    p = data.Patterns(seed=1, world_size=1, device=torch.device("cpu"))
    for (op, mode), why in library.UNSUPPORTED.items():
        assert library.make_case(op, mode, 64, p, 0, 1) is None and why


def _rank(samples, wrong=0, op="all_reduce"):
    return {"rows": [{"kind": "library", "op": op, "mode": "in-place", "bytes": 64, "count": 16,
                      "iters": 1, "wrong": wrong, "samples": samples}]}


def test_merge_takes_the_slowest_rank_per_repetition():
    merged = assemble.merge_ranks([_rank([1.0, 4.0]), _rank([3.0, 2.0], wrong=2)])
    assert merged[0]["samples"] == [3.0, 4.0] and merged[0]["wrong"] == 2
    assert merged[0]["world_size"] == 2
    with pytest.raises(RuntimeError, match="disagree"):
        assemble.merge_ranks([_rank([1.0]), _rank([1.0], op="broadcast")])


def _algs(lib_bw, ring_bw, n=4):
    rows = []
    for alg, bw in (("library", lib_bw), ("ring", ring_bw)):
        rows.append({"algorithm": alg, "bytes": 2**30, "busbw_GBps": bw, "world_size": n})
        rows.append({"algorithm": alg, "bytes": 1024, "busbw_GBps": 1.0, "world_size": n})
    import pandas as pd

    return pd.DataFrame(rows)


def test_bars_pass_fail_and_not_applicable():
    b = outcomes.bars_frame(assemble.bars(_algs(100.0, 80.0), "cuda", 4, 98.0, "in the same job"))
    assert list(b.columns) == outcomes.BAR_COLUMNS
    assert list(b["verdict"]) == ["pass", "pass", "pass"]
    assert b["ratio"].iloc[2] == pytest.approx(0.8) and "nccl-tests" in b["source"].iloc[0]
    # A slow hand-written ring and a library well below nccl-tests fail.
    b = outcomes.bars_frame(assemble.bars(_algs(100.0, 60.0), "cuda", 4, 110.0, ""))
    assert list(b["verdict"]) == ["fail", "pass", "fail"]
    # Two-sided: a library figure 10% above nccl-tests means the two sides differ too.
    b = outcomes.bars_frame(assemble.bars(_algs(110.0, 80.0), "cuda", 4, 100.0, ""))
    assert list(b["verdict"]) == ["pass", "fail", "pass"]
    b = outcomes.bars_frame(assemble.bars(_algs(100.0, 80.0), "cuda", 4, None, "not on PATH"))
    assert list(b["verdict"]) == ["not_applicable", "not_applicable", "pass"]
    assert "not on PATH" in b["note"].iloc[0]
    b = outcomes.bars_frame(assemble.bars(_algs(0.0, 0.0, n=1), "cuda", 1, None, ""))
    assert set(b["verdict"]) == {"not_applicable"} and "world size 1" in b["note"].iloc[0]
    b = outcomes.bars_frame(assemble.bars(_algs(1.0, 1.2, n=2), "cpu", 2, None, ""))
    assert set(b["verdict"]) == {"not_applicable"} and b["measured"].iloc[2] == 1.2


def test_checks_fail_on_a_wrong_element():
    merged = assemble.merge_ranks([_rank([1.0]), _rank([1.0], wrong=1)])
    [c] = assemble.checks(merged, "gloo")
    assert c.verdict == "fail" and c.value == 1
    [c] = assemble.checks(assemble.merge_ranks([_rank([1.0]), _rank([1.0])]), "gloo")
    assert c.verdict == "pass"


def test_nccl_tests_reference_is_the_median_over_cycles():
    rows = [{"size_bytes": 2**30, "ip_time_us": t, "ip_busbw_GBps": 0.0, "ip_wrong": 0.0}
            for t in (5000.0, 4000.0, 9000.0)]
    ref = nccltests.reference(rows, 8)
    assert ref["ip_time_s_median"] == pytest.approx(5e-3) and ref["cycles"] == 3
    assert ref["ip_busbw_GBps"] == pytest.approx(formulas.busbw("all_reduce", 8, 2**30, 5e-3))


def test_parse_nccl_tests_output():
    row = nccltests.parse((FIX / "all_reduce_perf_8gpu.txt").read_text())[-1]
    assert row["size_bytes"] == 2**30 and row["count"] == 2**28
    assert row["ip_busbw_GBps"] == pytest.approx(408.66) and row["oop_time_us"] == pytest.approx(4612.3)
    assert row["ip_wrong"] == 0
    old = nccltests.parse((FIX / "all_reduce_perf_old.txt").read_text())
    assert len(old) == 1 and old[0]["oop_busbw_GBps"] == pytest.approx(79.39)
    assert math.isnan(old[0]["ip_wrong"])
    assert nccltests.parse("# only comments\n") == []


def test_nccl_tests_binary_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nccltests.find() is None
    with pytest.raises(FileNotFoundError, match="not an executable"):
        nccltests.find(str(tmp_path / "missing"))


def test_nvlink_multicast_stays_off_unless_the_config_opts_in(monkeypatch):
    from gpulab import launch

    assert launch.safe_env({})["NCCL_NVLS_ENABLE"] == "0"
    assert launch.safe_env({"nvls": False}) == launch.SAFE_ENV
    assert launch.safe_env({"nvls": True}) == {} and launch.multicast_allowed({"nvls": True})
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # inherited from a user's shell
    launch.apply_safe_env({"backend": "cuda"})
    import os

    assert os.environ["NCCL_NVLS_ENABLE"] == "0"


def test_one_rank_claims_no_bandwidth_and_its_bars_are_not_applicable():
    # issue 24: with world size 1 algbw was bytes / launch time (40 TB/s on an H200) and a headline.
    row = assemble.stats_row({"kind": "library", "op": "all_reduce", "mode": "in-place",
                              "bytes": 2**30, "world_size": 1, "wrong": 0,
                              "samples": [2.7e-5, 2.7e-5]})
    assert math.isnan(row["algbw_GBps"]) and "no communication with one rank" in row["note"]
    b = assemble.bars(_algs(40000.0, 0.0, n=1), "cuda", 1, None, "")
    assert {x.verdict for x in b} == {"not_applicable"}
    assert all("no communication with one rank" in x.note and math.isnan(x.measured) for x in b)


def test_library_bar_without_handwritten_algorithms_against_nccl_tests_or_the_link():
    # issue 24: the health preset (collectives.algorithms: []) had no collectives bar at all.
    import pandas as pd

    lib = pd.DataFrame([{"op": op, "mode": "in-place", "bytes": s, "busbw_GBps": bw,
                         "world_size": 2} for op in ("all_reduce", "broadcast")
                        for s, bw in ((2**20, 50.0), (2**26, 360.0))])
    algs = assemble.library_allreduce(lib)
    assert set(algs["algorithm"]) == {"library"} and len(algs) == 2
    with_ref = assemble.bars(algs, "cuda", 2, 370.0, "same job")
    assert [x.verdict for x in with_ref] == ["pass", "pass", "not_applicable"]
    switch = [{"nvlinks": 18, "nvlinks_to": {}, "nvlinks_switch": 18} for _ in range(2)]
    link = assemble.link_limit("NVIDIA H200", switch)
    assert link.value == 450
    by_link = {x.bar: x for x in assemble.bars(algs, "cuda", 2, None, "not on PATH", link)}
    assert by_link[assemble.LINK_BAR].verdict == "pass"
    assert by_link[assemble.LINK_BAR].ratio == pytest.approx(360 / 450)
    slow = assemble.library_allreduce(lib.assign(busbw_GBps=100.0))
    assert {x.bar: x.verdict for x in assemble.bars(slow, "cuda", 2, None, "", link)}[
        assemble.LINK_BAR] == "fail"
    # A 4-GPU direct mesh with 2 visible: a third of the links reach the other rank.
    mesh = [{"nvlinks": 12, "nvlinks_to": {1 - k: 4}, "nvlinks_switch": 0} for k in range(2)]
    assert assemble.link_limit("NVIDIA H200", mesh).value == pytest.approx(150)
    pcie = [{"nvlinks": 0, "nvlinks_to": {}, "nvlinks_switch": 0, "pcie_gen_max": 4,
             "pcie_width_max": w} for w in (16, 8)]
    assert assemble.link_limit("NVIDIA L40S", pcie).value == pytest.approx(8 * 1.9692)
    unnamed = [{**mesh[k], "nvlinks_unknown": 8} for k in range(2)]
    assert not assemble.link_limit("NVIDIA H200", unnamed).known


def test_collective_busbw_above_the_memory_bandwidth_fails_the_physical_limit():
    import pandas as pd

    lib = pd.DataFrame([{"op": "all_reduce", "mode": "in-place", "bytes": 2**30,
                         "busbw_GBps": bw, "world_size": n} for bw, n in
                        ((400.0, 2), (40000.0, 2), (float("nan"), 1))])
    got = assemble.plausibility_checks(lib, "NVIDIA H200")
    assert [c.verdict for c in got] == ["pass", "fail"]
    assert "exceeds the physical limit" in got[1].note


def test_parse_nccl_tests_json_matches_its_text():
    doc = (FIX / "all_reduce_perf_8gpu.json").read_text()
    rows = nccltests.parse_json(doc)
    text = nccltests.parse((FIX / "all_reduce_perf_8gpu.txt").read_text())[-1]
    assert rows[0] == text  # the same run, through either format
    # cpu_time instead of time, "nan" strings and a null #wrong read as NaN, never as 0
    assert math.isnan(rows[1]["ip_time_us"]) and math.isnan(rows[1]["oop_wrong"])
    assert rows[1]["oop_busbw_GBps"] == pytest.approx(406.7)


def _fake_nccl_tests(tmp_path, help_text: str):
    """An all_reduce_perf stand-in: prints help_text for -h; writes the JSON fixture where -J
    points (the way nccl-tests does) and prints the text fixture."""
    exe = tmp_path / "all_reduce_perf"
    exe.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -h ]; then echo "{help_text}"; exit 0; fi\n'
        'while [ $# -gt 0 ]; do if [ "$1" = -J ]; then J="$2"; fi; shift; done\n'
        f'if [ -n "$J" ]; then cp {FIX / "all_reduce_perf_8gpu.json"} "$J"; '
        f'sed "s/408.66/1.00/" {FIX / "all_reduce_perf_8gpu.txt"}; '
        f'else cat {FIX / "all_reduce_perf_8gpu.txt"}; fi\n')
    exe.chmod(0o755)
    return str(exe)


def test_run_reads_json_where_the_build_has_J_else_text(tmp_path):
    new = tmp_path / "new"
    new.mkdir()
    exe = _fake_nccl_tests(new, "USAGE: all_reduce_perf [-J,--output_file <file>]")
    assert nccltests.supports_json(exe)
    rows = nccltests.run(exe, 8, 2**30)
    assert rows[0]["ip_busbw_GBps"] == pytest.approx(408.66)  # from the JSON, not the text
    old = tmp_path / "old"
    old.mkdir()
    exe = _fake_nccl_tests(old, "USAGE: all_reduce_perf [-b,--minbytes <min size in bytes>]")
    assert not nccltests.supports_json(exe)
    assert nccltests.run(exe, 8, 2**30)[-1]["ip_busbw_GBps"] == pytest.approx(408.66)
