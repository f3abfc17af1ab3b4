"""Sort stage: the algorithms' logic on CPU virtual devices (numpy backend), 1-4 devices."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpulab import outcomes, results, timing
from gpulab.sort import bench, het, keys, moves, p2p, radix
from gpulab.sort.backend import NumpyBackend, make_backend
from gpulab.sort.chunks import chunk_sizes
from gpulab.sort.merge import (leftmost_pivot, leftmost_pivot_bruteforce, merge_sorted,
                               multiway_merge)

ALGS = {"p2p": p2p.run, "het": het.run, "radix": radix.run}


def _run(alg, x, devices, **kw):
    b = NumpyBackend(devices)
    out = np.empty_like(x)
    try:
        info = ALGS[alg](b, x, out, timing.Stopwatch(), **kw)
    finally:
        b.close()
    return out, info


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64, np.float32])
def test_merge_sorted_is_a_stable_merge(dtype):
    rng = np.random.default_rng(1)
    for na, nb in [(0, 5), (5, 0), (1, 1), (17, 400), (1000, 999)]:
        a = np.sort(rng.integers(0, 50, na).astype(dtype))  # many ties between a and b
        b = np.sort(rng.integers(0, 50, nb).astype(dtype))
        out = merge_sorted(np, a, b)
        assert np.array_equal(out, np.sort(np.concatenate([a, b])))


def test_leftmost_pivot_matches_bruteforce_on_ties_and_unequal_lengths():
    rng = np.random.default_rng(2)
    for trial in range(300):
        la, lb = rng.integers(0, 40, 2)
        hi = int(rng.choice([2, 5, 1000]))  # few values -> many equal keys around the pivot
        a = np.sort(rng.integers(0, hi, la))
        b = np.sort(rng.integers(0, hi, lb))
        k = leftmost_pivot(lambda i: a[i], a.size, lambda i: b[i], b.size)
        assert k == leftmost_pivot_bruteforce(a, b), (a, b)


@pytest.mark.parametrize("devices", [2, 3, 4])
@pytest.mark.parametrize("dist", ["uniform", "zipf", "reverse", "sorted", "few_unique"])
def test_p2p_transferred_keys_equal_the_leftmost_pivot_minimum(devices, dist):
    """The issue's bar: P2P sort moves exactly 2 x (fewest keys any valid pivot allows)."""
    x = keys.make_keys(dist, "uint32", 1001, seed=3)  # 1001: chunks of unequal size
    minimum = []
    out, info = _run("p2p", x, devices,
                     observer=lambda L, R, k: minimum.append(leftmost_pivot_bruteforce(L, R)))
    assert np.array_equal(out, np.sort(x))
    assert len(minimum) == len(info["steps"]) > 0
    assert [s["pivot"] for s in info["steps"]] == minimum
    # keys_moved is counted from the copies actually made, both directions.
    assert info["keys_moved"] == 2 * sum(minimum)
    assert all(s["leftmost"] and s["valid"] for s in info["steps"])
    if dist == "sorted":
        assert info["keys_moved"] == 0


def test_p2p_four_device_schedule_is_pairs_cross_pairs():
    assert p2p._tree_levels((0, 1, 2, 3)) == [[((0,), (1,)), ((2,), (3,))], [((0, 1), (2, 3))]]
    x = keys.make_keys("uniform", "uint32", 4000, seed=4)
    _, info = _run("p2p", x, 4)
    pairs = [(s["round"], s["left"], s["right"]) for s in info["steps"]]
    assert pairs == [(0, "0", "1"), (0, "2", "3"), (1, "0+1", "2+3"), (2, "0", "1"), (2, "2", "3")]


@pytest.mark.parametrize("alg", ["p2p", "het", "radix"])
@pytest.mark.parametrize("devices", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("key_type", ["uint32", "uint64", "float32"])
def test_algorithms_sort_every_distribution(alg, devices, key_type):
    for i, dist in enumerate(keys.DISTRIBUTIONS):
        x = keys.make_keys(dist, key_type, 997 + 13 * i, seed=i)  # non-power-of-two sizes
        ref = keys.reference(x, numpy_max_keys=10**6)
        out, info = _run(alg, x, devices)
        check = keys.verify(np, out, ref)
        assert check["verified"] and check["equals_numpy"], (alg, devices, key_type, dist)
        if devices == 1 or alg == "het":
            assert info["keys_moved"] == 0


@pytest.mark.parametrize("dist", ["all_equal", "zipf", "few_unique"])
def test_radix_partition_stays_balanced_under_skew(dist):
    x = keys.make_keys(dist, "uint64", 3001, seed=5)
    b = NumpyBackend(3)
    try:
        chunks = [np.array(c) for c in np.array_split(x, 3)]
        rp = radix.RadixPartition(b, timing.Stopwatch())
        out = rp.sort(chunks)  # raises if any device got another count than its chunk size
    finally:
        b.close()
    assert [c.size for c in out] == chunk_sizes(3001, 3)
    assert np.array_equal(np.concatenate(out), np.sort(x))
    assert rp.passes <= 1 + 2 * 3  # 64-bit keys: 4 rounds of 16 bits, shared first round
    if dist == "all_equal":
        assert rp.tie_keys == 3001  # every key equals the boundary keys: split by occurrence


def test_multiway_merge_in_parallel_parts_with_skew():
    rng = np.random.default_rng(6)
    runs = [np.sort(rng.integers(0, 3, 70000).astype(np.uint32)) for _ in range(3)]
    runs.append(np.sort(rng.integers(0, 2**32, 90000, dtype=np.uint32)))
    out = np.empty(sum(r.size for r in runs), np.uint32)
    parts = multiway_merge(runs, out, threads=4)
    assert parts > 1
    assert np.array_equal(out, np.sort(np.concatenate(runs)))


def test_verification_catches_lost_and_misplaced_keys():
    x = keys.make_keys("uniform", "uint64", 5000, seed=7)
    ref = keys.reference(x, numpy_max_keys=0)  # fingerprint only
    good = np.sort(x)
    assert keys.verify(np, good, ref)["verified"]
    bad = good.copy()
    bad[10] = bad[11]  # still sorted, but a key is lost and one duplicated
    v = keys.verify(np, bad, ref)
    assert v["sorted"] and not v["multiset"] and not v["verified"]
    swapped = good.copy()
    swapped[[0, -1]] = swapped[[-1, 0]]
    v = keys.verify(np, swapped, ref)
    assert v["multiset"] and not v["sorted"]


def test_make_keys_distributions_and_bad_names():
    for kt in keys.KEY_TYPES:
        assert keys.is_sorted(np, keys.make_keys("sorted", kt, 500, 1))
        assert keys.is_sorted(np, keys.make_keys("reverse", kt, 500, 1)[::-1])
        eq = keys.make_keys("all_equal", kt, 500, 1)
        assert np.unique(eq).size == 1 and eq[0] != 0
        assert np.unique(keys.make_keys("few_unique", kt, 5000, 1)).size <= keys.FEW_UNIQUE
        assert np.unique(keys.make_keys("uniform", kt, 5000, 1)).size > 4000
    f = keys.make_keys("normal", "float32", 1000, 1)
    assert (f < 0).any() and (f > 0).any()  # both signs: exercises the ordered-bits mapping
    with pytest.raises(ValueError, match="unknown distribution 'gauss'"):
        keys.make_keys("gauss", "uint32", 10, 1)
    with pytest.raises(ValueError, match="unknown key type 'int8'"):
        keys.make_keys("uniform", "int8", 10, 1)
    with pytest.raises(ValueError, match="unknown device kind"):
        make_backend("tpu", 1)


def test_ordered_bits_preserve_float_order():
    x = np.array([-3.5, -1e-30, 0.0, 1e-30, 2.0, np.inf, -np.inf], dtype=np.float32)
    u = keys.ordered_bits(np, x)
    assert np.array_equal(np.argsort(u, kind="stable"), np.argsort(x, kind="stable"))


@pytest.mark.slow
def test_stage_writes_verified_tables_and_bars(tmp_path):
    from gpulab.sort import run
    from gpulab.stage import stage_main

    cfg = {"stage": {"gpus": "all", "algorithms": ["p2p", "het", "radix"],
                     "baselines": ["numpy", "torch", "cupy"], "device_counts": [2, 3, 8],
                     "key_types": ["uint32", "float32"], "distributions": ["uniform", "zipf"],
                     "sweep_sizes": [3000, 7001], "matrix_size": 2001, "bar_keys": 1 << 20,
                     "verify_numpy_max_keys": 5000, "numpy_max_keys": 5000, "warmup": 1,
                     "repeats": 2, "seed": 1},
           "devices": {"backend": "cpu", "cpu_devices": 3}}
    out = tmp_path / "sort.h5"
    assert stage_main("sort", run, argv=["--config-json", json.dumps(cfg), "--out", str(out)]) == 0
    a = results.read_attrs(out)
    assert a["device_kind"] == "cpu" and a["verdict"] == "pass"
    assert a["verdict_counts"]["crashed"] == 0
    assert not {"all_verified", "verified"} & set(a)
    runs = results.read_table(out, "runs")
    assert runs["verified"].all()
    assert runs.attrs["units"]["keys_per_s"] == "keys/s"
    assert set(runs["algorithm"]) >= {"numpy.sort", "p2p", "het", "radix"}
    assert set(runs["devices"]) == {1, 2, 3}  # baselines on 1; no 1-device algorithm runs asked
    # 7001 keys: above verify_numpy_max_keys, so checked by sortedness + multiset only
    big = runs[runs["n_keys"] == 7001]
    assert {c.replace("+indices", "") for c in big["checks"]} == {"sorted+multiset"}
    phases = results.read_table(out, "phases")
    p2p3 = phases[(phases["algorithm"] == "p2p") & (phases["devices"] == 3)]
    assert {"h2d", "local_sort", "pivot_search", "exchange", "merge", "d2h"} <= set(p2p3["phase"])
    logic = results.read_table(out, "logic_check")  # 4 > 3 devices present: logical devices
    assert set(logic["logical_devices"]) == {4} and logic["verified"].all()
    assert set(logic["algorithm"]) == {"p2p", "het", "radix"} and logic["pivots_leftmost"].all()
    na = results.read_table(out, "not_applicable")
    assert "8 devices" in set(na["what"]) and "cupy.sort" in set(na["what"])
    assert "CUDA" in na.set_index("what").loc[bench.HARNESS_CHECK, "reason"]
    checks = results.read_table(out, "checks")
    assert set(checks["verdict"]) == {"pass"}
    assert len(checks[checks["check"] == "sorted permutation of the input"]) == len(runs) + len(logic)
    moved = checks[checks["check"] == moves.CHECK].set_index("case")
    assert len(moved) == 2  # 2 and 3 devices
    two = moved.loc[[c for c in moved.index if " on 2 devices" in c][0]]
    assert two["value"] == two["bound"] > 0
    bars = results.read_table(out, "bars")
    assert list(bars.columns) == outcomes.BAR_COLUMNS and len(bars) == 1
    assert bars["verdict"].iloc[0] == "not_applicable" and "cores" in bars["note"].iloc[0]

    # The report section renders this result (figures, tables) and gives headlines.
    from gpulab.kit.html import Figures
    from gpulab.sort import section

    figs = Figures()
    html = section.render([out], figs)
    assert figs.figure_no == 3 and "logical devices" in html and "FAILED" not in html
    assert "sort checks verified" in html and "failed" not in html
    assert section.headlines([out]) and "sort checks verified" in section.headlines([out])[0]
    assert section.references([out]).empty  # the speed-up bar is not applicable on CPU


def _minimal_exchange_bruteforce(left: list, right: list) -> int:
    """Fewest keys ending on the other device of two, by trying every split of the keys (tags are
    the keys' list positions) into a left part of len(left) keys, all <= every right key."""
    import itertools

    tagged = [(v, 0) for v in left] + [(v, 1) for v in right]
    best = None
    for pick in itertools.combinations(range(len(tagged)), len(left)):
        chosen = set(pick)
        low = [tagged[i] for i in pick]
        high = [tagged[i] for i in range(len(tagged)) if i not in chosen]
        if low and high and max(v for v, _ in low) > min(v for v, _ in high):
            continue
        moved = sum(side != 0 for _, side in low) + sum(side != 1 for _, side in high)
        best = moved if best is None else min(best, moved)
    return best


def test_p2p_exchange_is_the_bruteforced_minimum_on_small_inputs():
    rng = np.random.default_rng(11)
    for trial in range(150):
        n = int(rng.integers(2, 13))
        hi = int(rng.choice([2, 4, 1000]))  # ties decide what a minimal exchange may leave
        x = rng.integers(0, hi, n).astype(np.uint32)
        sizes = chunk_sizes(n, 2)
        left, right = sorted(x[:sizes[0]].tolist()), sorted(x[sizes[0]:].tolist())
        out, info = _run("p2p", x, 2)
        assert np.array_equal(out, np.sort(x))
        claimed = 2 * sum(s["pivot"] for s in info["steps"])
        assert claimed == _minimal_exchange_bruteforce(left, right), (x, info["steps"])


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_moved_keys_counted_from_origin_tags_match_the_pivots(devices):
    b = NumpyBackend(devices)
    try:
        counted, needed, claimed = moves.count_run(b, 5003, 8,
                                                   lambda be: p2p.P2PMerge(be, timing.Stopwatch()))
    finally:
        b.close()
    assert counted == needed > 0
    check = moves.judge("t", devices, counted, needed, claimed)
    assert check.verdict == "pass", check
    if devices == 2:
        assert claimed == needed


def test_moved_keys_check_fails_on_a_wrong_pivot(monkeypatch):
    real = p2p.leftmost_pivot

    def one_too_many(left_at, len_left, right_at, len_right):
        return min(real(left_at, len_left, right_at, len_right) + 1, len_left, len_right)

    monkeypatch.setattr(p2p, "leftmost_pivot", one_too_many)
    b = NumpyBackend(2)
    try:
        counted, needed, claimed = moves.count_run(b, 4001, 8,
                                                   lambda be: p2p.P2PMerge(be, timing.Stopwatch()))
    finally:
        b.close()
    assert claimed == needed + 2
    assert moves.judge("wrong pivot", 2, counted, needed, claimed).verdict == "fail"


def test_moved_keys_check_fails_on_a_corrupted_output():
    keys_ = moves.tagged_keys(1000, 3)
    origin = moves.origins(keys_, [500, 500])
    good = [np.arange(500), np.arange(500, 1000)]
    needed = moves.needed_moves(origin, [500, 500])
    assert moves.ended_elsewhere(origin, good) == needed
    # Swap a key that started on device 0 with one that started on device 1, each now sitting
    # at home: afterwards both sit on the wrong device.
    a, c = int(np.flatnonzero(origin[good[0]] == 0)[0]), int(np.flatnonzero(origin[good[1]] == 1)[0])
    bad = [good[0].copy(), good[1].copy()]
    bad[0][a], bad[1][c] = good[1][c], good[0][a]
    counted = moves.ended_elsewhere(origin, bad)
    assert counted == needed + 2
    assert moves.judge("corrupted", 2, counted, needed, needed).verdict == "fail"


def test_harness_check_fails_on_an_injected_delay():
    assert bench.harness_verdict("2^30 keys", 1.02).verdict == "pass"
    slow = bench.harness_verdict("2^30 keys", 1.25)
    assert slow.verdict == "fail" and slow.check.startswith("harness overhead")


def _h2h(alg, devices, t, n=1000):
    return {"sweep": "size", "algorithm": alg, "scope": "host-to-host", "devices": devices,
            "n_keys": n, "time_s_median": t, "verified": True}


def test_sort_speedup_bar_against_one_device_and_fails_when_slow():
    rows = [_h2h("p2p", 1, 8.0), _h2h("p2p", 4, 2.5), _h2h("radix", 1, 8.0), _h2h("radix", 4, 6.0),
            _h2h("p2p", 4, 100.0, n=10)]
    bars = {b.bar.split()[0]: b for b in bench.speedup_bars(rows, "cuda", 4)}
    assert bars["p2p"].verdict == "pass" and bars["p2p"].measured == pytest.approx(3.2)
    assert bars["p2p"].ratio == pytest.approx(0.8) and "one device" in bars["p2p"].source
    assert bars["radix"].verdict == "fail" and bars["radix"].ratio == pytest.approx(1 / 3)
    [cpu] = bench.speedup_bars(rows, "cpu", 4)
    assert cpu.verdict == "not_applicable"
    [one] = bench.speedup_bars(rows, "cuda", 1)
    assert one.verdict == "not_applicable" and "1 here" in one.note


def _settings(**section):
    """The stage's typed view of a section given in part (the schema fills in the rest)."""
    from gpulab import config
    from gpulab.sort.settings import Settings

    return Settings.from_section(config.validate_section("sort", section))


def test_a_crashed_case_is_a_failed_check():
    b = bench.Bench(_settings(device_counts=[1], warmup=0, repeats=1), "cpu", 1, "cpu")
    try:
        try:
            raise MemoryError("out of device memory")
        except MemoryError as exc:
            b._fail("p2p on 1 device(s) uint32/uniform/10", exc)
        checks = b.checks([])
    finally:
        b.close()
    assert [c.verdict for c in checks] == ["fail"] and "out of device memory" in checks[0].note


def _fake_cupy_bench(monkeypatch, clock=None, path_cost=1.0):
    """A Bench whose CUDA path is driven by the numpy backend standing in for CuPy (cp.sort is
    numpy.sort). ``clock()``: seconds per call the next timed batch reports (a fake GPU clock),
    times ``path_cost`` on the path side; None times for real. Returns (bench, batch sizes seen)."""
    from gpulab.sort import backend as backend_mod

    monkeypatch.setattr(bench, "HARNESS_MIN_KEYS", 4096)  # the real floor is 2^24 keys
    cfg = _settings(bar_keys=4096, warmup=0, repeats=2, device_counts=[1], algorithms=["p2p"])
    b = bench.Bench(cfg, "cpu", 1, "cpu")
    batches, on_path = [], {"yes": False}
    real_sort = p2p.P2PMerge.sort

    def spy(self, chunks):
        on_path["yes"] = True
        return real_sort(self, chunks)

    monkeypatch.setattr(p2p.P2PMerge, "sort", spy)

    class FakeCupy(backend_mod.NumpyBackend):
        cp = np

        def time_device(self, fn, d, warmup, repeats, batch=1):
            batches.append(batch)
            on_path["yes"] = False
            st = super().time_device(fn, d, warmup, repeats, batch=batch)
            if clock is None:
                return st
            cost = path_cost if on_path["yes"] else 1.0
            return timing.summarize([clock() * cost for _ in range(repeats)])

    b.kind, b.single = "cuda", FakeCupy(1)
    return b, batches


def test_sort_harness_times_both_sides_in_batches_of_abba_blocks(monkeypatch):
    # issue 24: one CUDA-event pair around one sort times the launch gap too; both sides of the
    # harness check time batches of HARNESS_BATCH back-to-back calls, one per side to warm up,
    # then 4 per ABBA block.
    b, batches = _fake_cupy_bench(monkeypatch)
    check = b.harness_check(seed=0)
    assert check.check == bench.HARNESS_CHECK and check.bound == bench.HARNESS_BOUND
    assert batches == [bench.HARNESS_BATCH] * (2 + 4 * bench.HARNESS_BLOCKS)
    assert check.case.startswith("4096 uint32 keys") and "12 ABBA blocks" in check.note


def test_sort_harness_check_drops_a_drifting_clock_and_fails_a_real_overhead(monkeypatch):
    # A healthy H100 at 2^20 keys read +10.3 % and +7.0 % with two cupy-first rounds: a clock
    # settling while the check runs slows whichever side runs later. Here the fake GPU clock slows
    # 2 % per batch and steps 30 % once; both sides do the same work.
    t = {"n": 0}

    def drifting():
        t["n"] += 1
        return 1e-3 * (1 + 0.02 * t["n"]) * (1.3 if t["n"] == 21 else 1.0)

    b, _ = _fake_cupy_bench(monkeypatch, drifting)
    ok = b.harness_check(seed=0)
    assert ok.verdict == "pass" and abs(ok.value) < 0.005, ok
    t["n"] = 0
    slow, _ = _fake_cupy_bench(monkeypatch, drifting, path_cost=1.08)  # 8 % on every path call
    bad = slow.harness_check(seed=0)
    assert bad.verdict == "fail" and bad.value == pytest.approx(0.08, abs=0.005), bad


def test_sort_harness_check_sorts_at_least_its_floor(monkeypatch):
    # The check's size is its own: the quick preset's bar_keys (2^20) is too small to judge.
    cfg = _settings(bar_keys=1 << 20, warmup=0, repeats=2, device_counts=[1], algorithms=["p2p"])
    b = bench.Bench(cfg, "cpu", 1, "cpu")
    seen = {}

    def keys_then_stop(dist, key_type, n, seed):
        seen["n"] = n
        raise RuntimeError("stop")

    monkeypatch.setattr(bench, "make_keys", keys_then_stop)
    b.kind, b.single.cp = "cuda", np
    with pytest.raises(RuntimeError, match="stop"):
        b.harness_check(seed=0)
    assert seen["n"] == bench.HARNESS_MIN_KEYS == 1 << 24


def test_sort_headlines_report_the_fixed_algorithm_not_the_best(tmp_path):
    # issue 24: the headline took the bar with the highest ratio and the fastest algorithm; it now
    # reports p2p (the fixed, named configuration) and counts the failed bars.
    from gpulab.sort import section

    r = results.Result("sort", "main", {}, "cuda")
    r.attrs.update({"device_kind": "cuda", "device_name": "NVIDIA H200", "devices_available": 4})
    r.add_table("bars", outcomes.bars_frame([
        outcomes.Bar.measure(f"{alg} sort of 1000 keys on 4 GPUs: speed-up vs one GPU", s, 4,
                             source=bench.SPEEDUP_SOURCE, threshold=0.5, unit="x")
        for alg, s in (("radix", 3.9), ("p2p", 1.2))]))
    r.add_table("runs", pd.DataFrame([
        {"scope": "host-to-host", "sweep": "size", "algorithm": alg, "key_type": "uint32",
         "distribution": "uniform", "n_keys": 1000, "devices": d, "keys_per_s": kps}
        for alg, d, kps in (("radix", 4, 9e9), ("p2p", 4, 2e9), ("p2p", 1, 1e9))]))
    r.add_table("checks", outcomes.checks_frame([outcomes.Check.of("c", "x", True)]))
    path = results.write(r, tmp_path / "s.h5")
    heads = section.headlines([path])
    assert heads[0].startswith("p2p sort") and ": fail" in heads[0] and "1 of 2" in heads[0]
    assert "p2p on 4 device(s), 2.00 Gkeys/s" in heads[1]
