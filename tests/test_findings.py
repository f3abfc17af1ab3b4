"""Findings: each stage's rules on fixture rows (healthy and degraded), their traceability, the
'not measurable here' list, and that no finding contradicts a bar."""
from __future__ import annotations

import pandas as pd
import pytest

from gpulab import findings, outcomes, results
from gpulab.data import findings as data_f
from gpulab.findings import Finding, NotMeasurable, Rows
from gpulab.gemm import findings as gemm_f
from gpulab.kernels import findings as kernels_f
from gpulab.outcomes import Bar
from gpulab.transfer import findings as transfer_f
from exportfixtures import _write, make_results


class FakeRows(Rows):
    """Rows whose tables are given (fixture rows), not read from files."""

    def __init__(self, stage, tables):
        super().__init__(stage, "h1", [])
        self._cache = {k: v for k, v in tables.items()}

    def table(self, name):
        return self._cache.get(name, pd.DataFrame())


def _hd(pinned=55.3, pageable=7.3):
    rows = []
    for direction in ("H2D", "D2H"):
        for mem, v in (("pinned", pinned), ("pageable", pageable)):
            for call in ("async", "blocking"):
                for n in (1 << 20, 1 << 30):
                    rows.append({"direction": direction, "memory": mem, "call": call, "device": 0,
                                 "bytes": n, "value_median": v if n == 1 << 30 else v / 10})
    return pd.DataFrame(rows)


def test_pinned_vs_pageable_states_its_numbers_and_rows():
    out = transfer_f.pinned_vs_pageable(FakeRows("transfer", {"host_device": _hd()}))
    h2d = next(f for f in out if "H2D" in f.statement)
    assert h2d.statement == ("pinned host memory moves data 7.6x faster than pageable on this host "
                             "(55.3 vs 7.3 GB/s, H2D, 1 GiB)")
    assert h2d.numbers["speedup"] == pytest.approx(55.3 / 7.3)
    assert [r["keys"]["memory"] for r in h2d.rows] == ["pinned", "pageable"]
    assert all(r["keys"]["bytes"] == 1 << 30 and r["table"] == "host_device" for r in h2d.rows)
    # degraded: pinned slower than pageable is stated as such, never as "faster"
    (bad, _) = transfer_f.pinned_vs_pageable(FakeRows("transfer", {"host_device": _hd(5.0, 7.3)}))
    assert "slower than pageable" in bad.statement
    nm = transfer_f.pinned_vs_pageable(FakeRows("transfer", {}))
    assert isinstance(nm, NotMeasurable) and "CUDA" in nm.reason


def _loads(h5_s=0.001, csv_s=0.019):
    rows = []
    for ds, n in (("small", 100), ("tabular-2M", 2_000_000)):
        rows += [{"dataset": ds, "rows": n, "format": "h5", "method": "h5py-whole",
                  "load_s_median": h5_s},
                 {"dataset": ds, "rows": n, "format": "h5", "method": "h5py-chunked",
                  "load_s_median": h5_s * 2},
                 {"dataset": ds, "rows": n, "format": "csv", "method": "pandas",
                  "load_s_median": csv_s},
                 {"dataset": ds, "rows": n, "format": "json", "method": "json",
                  "load_s_median": csv_s * 3}]
    return pd.DataFrame(rows)


def test_hdf5_vs_csv_at_the_largest_dataset():
    f = data_f.hdf5_vs_csv(FakeRows("data", {"loads": _loads()}))
    assert f.statement.startswith("HDF5 loads 19.0x faster than CSV at 2,000,000 rows")
    assert {r["keys"]["dataset"] for r in f.rows} == {"tabular-2M"}
    assert [r["keys"]["method"] for r in f.rows] == ["h5py-whole", "pandas"]
    slow = data_f.hdf5_vs_csv(FakeRows("data", {"loads": _loads(0.05, 0.01)}))
    assert "5.0x slower than CSV" in slow.statement


def _kbars(measured, ref=4000.0):
    return outcomes.bars_frame([Bar.measure(kernels_f.ROOFLINE_BAR + " (largest size)", measured,
                                            ref, source="torch copy_", threshold=0.8, unit="GB/s")])


def test_divide_roofline_follows_its_bar():
    ok = kernels_f.divide_roofline(FakeRows("kernels", {"bars": _kbars(4145.0)}))
    assert "at the copy roofline (1.04 of a same-size copy" in ok.statement and ok.claim == "pass"
    low = kernels_f.divide_roofline(FakeRows("kernels", {"bars": _kbars(2000.0)}))
    assert "below the copy roofline (0.50" in low.statement and low.claim == "fail"
    na = outcomes.bars_frame([Bar.not_applicable(kernels_f.ROOFLINE_BAR + " (largest size)",
                                                 "needs CUDA")])
    nm = kernels_f.divide_roofline(FakeRows("kernels", {"bars": na}))
    assert isinstance(nm, NotMeasurable) and nm.reason == "needs CUDA"


def test_fastest_dtype_at_the_largest_size():
    df = pd.DataFrame({"M": [512, 512, 8192, 8192], "N": [512, 512, 8192, 8192],
                       "K": [512, 512, 8192, 8192], "dtype": ["bf16", "fp32", "bf16", "fp32"],
                       "tflops_median": [10.0, 5.0, 733.0, 50.0]})
    f = gemm_f.fastest_dtype(FakeRows("gemm", {"single": df}))
    assert f.statement == "bf16 GEMM is 14.7x faster than fp32 at 8192x8192x8192 (733 vs 50 TFLOP/s)"
    assert isinstance(gemm_f.fastest_dtype(FakeRows("gemm", {"single": df[df.dtype == "bf16"]})),
                      NotMeasurable)


def test_a_finding_never_contradicts_a_bar(tmp_path):
    root = tmp_path / "results"
    make_results(root)
    for measured, host in ((4145.0, "h200a"), (2000.0, "h200b")):
        _write(root, "kernels", host, "main", "cuda", {"bars": (_kbars(measured), {})})
    files = results.find_results(root)
    found, missing = findings.derive(files)
    roof = {f.host: f for f in found if f.rule == "kernels.divide_roofline"}
    assert roof["h200a"].claim == "pass" and roof["h200b"].claim == "fail"
    assert findings.contradictions(found, files) == []
    # a finding that claimed the opposite of its bar is caught
    wrong = Finding("kernels.x", "at the roofline", {}, [], "", host="h200b",
                    bar=roof["h200b"].bar, claim="pass")
    assert findings.contradictions([wrong], files) == [
        f"kernels.x on h200b: says 'pass', bar {roof['h200b'].bar!r} is fail"]
    # h200b has no data result: listed as not measurable, with the reason
    assert any(m.rule == "data.hdf5_vs_csv" and m.reason == "no data result on this host"
               for m in missing)


def test_findings_html_lists_statements_rows_and_not_measurable(tmp_path):
    root = tmp_path / "results"
    make_results(root)
    html = findings.findings_html(results.find_results(root))
    assert "bf16 GEMM is 14.7x faster than fp32 at 8192x8192x8192" in html
    assert "gemm/single M=8192, N=8192, K=8192, dtype=bf16" in html
    assert "not measurable here" in html


def test_a_broken_rule_is_reported_not_fatal():
    def boom(rows):
        raise KeyError("col")

    found, missing = findings.apply([boom], FakeRows("gemm", {}))
    assert found == [] and "the rule failed" in missing[0].reason


def test_energy_findings_and_the_throughput_vs_efficiency_figure(tmp_path):
    from gpulab.report import energy as energy_figure
    from gpulab.kit.html import Figures

    root = tmp_path / "results"
    make_results(root)  # its transfer result has one resolved copy energy row
    files = results.find_results(root)
    found, missing = findings.derive(files)
    (f,) = [f for f in found if f.rule == "transfer.copy_energy"]
    assert f.statement == ("same-device copy on GPU0 costs 0.15 J/GB (6.667 GB/J at 4000 GB/s, "
                           "600 W average)")
    assert f.numbers["duration_s"] == 1.2 and f.rows[0]["table"] == "energy"
    assert any(m.rule == "gemm.gemm_energy" and m.reason == "no energy table in the result"
               for m in missing)
    figs = Figures()
    html = energy_figure.render(files, figs)
    assert figs.figure_no == 1 and "Throughput vs energy efficiency" in html


def test_unresolved_energy_is_not_measurable_with_its_note():
    df = pd.DataFrame([{"operation": "copy", "device": "cuda:0", "work_unit": "GB", "resolved": False,
                        "note": "region 0.2 s < 1 s: the counter cannot resolve it"}])
    out = transfer_f.copy_energy(FakeRows("transfer", {"energy": df}))
    assert isinstance(out[0], NotMeasurable) and "cannot resolve" in out[0].reason


def _ring(ratios, bar_verdict=None):
    rows = []
    for n, x in ratios.items():
        rows += [{"algorithm": "library", "bytes": n, "busbw_GBps": 100.0, "world_size": 8},
                 {"algorithm": "ring", "bytes": n, "busbw_GBps": 100.0 * x, "world_size": 8}]
    tables = {"allreduce_algorithms": pd.DataFrame(rows)}
    if bar_verdict:
        from gpulab.collectives import findings as cf

        last = ratios[max(ratios)]
        tables["bars"] = outcomes.bars_frame([Bar.measure(cf.RING_BAR, 100 * last, 100.0,
                                                          source="library", threshold=0.7,
                                                          unit="GB/s")])
    return tables


def test_ring_reaches_library_from_a_size_and_agrees_with_its_bar():
    from gpulab.collectives import findings as cf

    f = cf.ring_reaches_library(FakeRows("collectives", _ring(
        {1 << 10: 0.2, 1 << 20: 0.5, 1 << 26: 0.75, 1 << 30: 0.9}, "x")))
    assert f.statement == ("the hand-written ring all-reduce reaches 0.7 of the library from 64 MiB "
                           "on (0.75 there, 0.90 at 1 GiB)")
    assert f.claim == "pass" and f.bar == cf.RING_BAR
    low = cf.ring_reaches_library(FakeRows("collectives", _ring({1 << 20: 0.8, 1 << 30: 0.5}, "x")))
    assert "stays below 0.7 of the library up to 1 GiB (0.50" in low.statement
    assert low.claim == "fail"
    assert isinstance(cf.ring_reaches_library(FakeRows("collectives", {})), NotMeasurable)


def test_sort_winner_by_key_count():
    from gpulab.sort import findings as sf

    rows = []
    for n, times in ((4096, {"p2p": 1.0, "radix": 2.0}), (1 << 20, {"p2p": 1.0, "radix": 2.0}),
                     (1 << 24, {"p2p": 3.0, "radix": 2.0})):
        for algo, t in times.items():
            for dev in (1, 4):
                rows.append({"sweep": "size", "scope": "host-to-host", "devices": dev,
                             "n_keys": n, "algorithm": algo, "time_s_median": t * dev,
                             "keys_per_s": n / t, "key_type": "uint32", "distribution": "uniform"})
    f = sf.winner_by_key_count(FakeRows("sort", {"runs": pd.DataFrame(rows)}))
    assert f.statement == ("fastest sort on 4 device(s), host to host: p2p from 4,096 to 1,048,576 "
                           "keys; radix at 16,777,216 keys")
    assert [r["keys"]["algorithm"] for r in f.rows] == ["p2p", "p2p", "radix"]


def test_best_comm_hook():
    from gpulab.train import findings as tf

    df = pd.DataFrame([{"sweep": "comm", "model": "cnn", "devices": 2, "local_batch": 32,
                        "bucket_cap_mb": 1, "comm_hook": h, "samples_per_s": v}
                       for h, v in (("none", 2000.0), ("fp16", 3000.0), ("powersgd", 4000.0))])
    (f,) = tf.best_comm_hook(FakeRows("train", {"ddp": df}))
    assert f.statement == ("the powersgd DDP hook trains cnn 2.00x faster than no hook on 2 devices "
                           "(4000 vs 2000 samples/s, local batch 32, bucket 1 MB)")
    assert [r["keys"]["comm_hook"] for r in f.rows] == ["powersgd", "none"]
    df.loc[df.comm_hook == "none", "samples_per_s"] = 5000.0
    (g,) = tf.best_comm_hook(FakeRows("train", {"ddp": df}))
    assert g.statement.startswith("DDP with no communication hook is the fastest for cnn")
    assert isinstance(tf.best_comm_hook(FakeRows("train", {})), NotMeasurable)
