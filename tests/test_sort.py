"""Sort stage: the algorithms' logic on CPU virtual devices (numpy backend), 1-4 devices."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gpulab import results, timing
from gpulab.sort import het, keys, p2p, radix
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
@pytest.mark.parametrize("devices", [1, 2, 3, 4])
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
    assert a["device_kind"] == "cpu" and a["all_verified"] is True and a["failures"] == 0
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
    skipped = results.read_table(out, "skipped")
    assert "8 devices" in set(skipped["what"]) and "cupy.sort" in set(skipped["what"])
    bars = results.read_table(out, "bars").set_index("bar")
    assert len(bars) == 2
    single = bars.loc[[b for b in bars.index if b.startswith("single-device")][0]]
    assert single["passed"] == "n/a"
    pivot = bars.loc[[b for b in bars.index if b.startswith("P2P")][0]]
    assert pivot["passed"] == "True" and pivot["measured"] == pivot["reference"] > 0

    # The report section renders this result (figures, tables) and gives headlines.
    from gpulab.report.html import Figures
    from gpulab.sort import section

    figs = Figures()
    html = section.render([out], figs)
    assert figs.figure_no == 3 and "logical devices" in html and "FAILED" not in html
    assert section.headlines([out]) and "all" in section.headlines([out])[0]
    assert section.references([out]).empty  # the cupy bar is not applicable on CPU
