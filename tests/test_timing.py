import pytest

from gpulab import timing


def test_summarize_median_and_spread():
    s = timing.summarize([3.0, 1.0, 2.0, 10.0, 2.0])
    assert s.median == 2.0 and s.min == 1.0 and s.max == 10.0 and s.n == 5
    assert s.spread == pytest.approx(4.5)
    d = s.as_dict("t")
    assert d["t_median"] == 2.0 and d["repeats"] == 5


def test_measure_runs_warmup_then_repeats_with_fresh_setup():
    calls, setups = [], []
    s = timing.measure(lambda: calls.append(1), warmup=3, repeats=4, setup=lambda: setups.append(1))
    assert len(calls) == 7 and len(setups) == 7 and s.n == 4
    assert all(x >= 0 for x in s.samples)


def test_measure_rejects_zero_repeats():
    with pytest.raises(ValueError):
        timing.measure(lambda: None, repeats=0)


def test_stopwatch_accumulates_phases():
    sw = timing.Stopwatch()
    for _ in range(2):
        with sw.phase("a"):
            sum(range(1000))
    assert set(sw.phases) == {"a"} and sw.phases["a"] > 0


def test_measure_batch_times_back_to_back_calls_and_reports_per_call_time(monkeypatch):
    # issue 24: one timer pair around `batch` calls, sample = elapsed / batch (so a launch gap
    # before one short call is not counted as the call's time).
    clock = iter([0.0, 10.0, 10.0, 30.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    calls = []
    s = timing.measure(lambda: calls.append(1), warmup=0, repeats=2, batch=10)
    assert len(calls) == 20 and s.samples == (1.0, 2.0)
    with pytest.raises(ValueError):
        timing.measure(lambda: None, batch=0)


def test_abba_block_ratios_cancel_a_linear_drift_that_side_by_side_rounds_do_not():
    # Both sides do the same work; the clock slows 5 % per batch. ABBA pairs each side with its
    # neighbours in time; rounds of one side then the other read the later side slower.
    def run(order):
        t = {"n": 0}

        def batch(side):
            t["n"] += 1
            return 1.0 + 0.05 * t["n"]

        return timing.block_ratios(batch, order, "a", "b")

    abba = run(timing.abba_order("a", "b", 4))
    assert timing.abba_order("a", "b", 1) == [("a", "b", "b", "a")]
    assert all(r == pytest.approx(1.0) for r in abba)
    rounds = run([("a", "a", "a", "b", "b", "b")] * 4)
    assert all(r < 0.95 for r in rounds)
