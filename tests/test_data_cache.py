"""The dataset cache (results/data/cache/): generated once per (generator, seed, sizes), reused."""
import numpy as np
import pytest

from conftest import stage_settings
from gpulab.data import bench, cache, datasets, train_sets


def test_a_second_request_reads_the_cache_instead_of_generating(tmp_path, monkeypatch):
    first, hit = cache.cached(tmp_path, "tabular", rows=50, features=4, classes=3, seed=7)
    assert not hit and len(list(tmp_path.glob("tabular-*.npz"))) == 1
    monkeypatch.setattr(datasets, "tabular", lambda **kw: pytest.fail("generated again"))
    again, hit = cache.cached(tmp_path, "tabular", rows=50, features=4, classes=3, seed=7)
    assert hit and again.name == first.name and again.meta == first.meta
    assert np.array_equal(again.x, first.x) and np.array_equal(again.y, first.y)
    assert again.x.dtype == np.float32 and again.y.dtype == np.int64


def test_the_key_is_the_content_seed_sizes_and_generator_code(tmp_path, monkeypatch):
    base = {"rows": 20, "features": 3, "classes": 2, "seed": 0}
    keys = {cache.key("tabular", base), cache.key("tabular", {**base, "seed": 1}),
            cache.key("tabular", {**base, "rows": 21}), cache.key("images", base)}
    assert len(keys) == 4
    # a generator edited: every old entry is a different key (never read stale)
    before = cache.key("tabular", base)
    src = tmp_path / "datasets.py"
    src.write_text(open(datasets.__file__).read() + "\n# changed\n")
    monkeypatch.setattr(datasets, "__file__", str(src))
    assert cache.key("tabular", base) != before


def test_a_damaged_entry_is_generated_again(tmp_path):
    cache.cached(tmp_path, "tabular", rows=10, features=2, classes=2, seed=0)
    (entry,) = tmp_path.glob("*.npz")
    entry.write_bytes(b"not an npz")
    ds, hit = cache.cached(tmp_path, "tabular", rows=10, features=2, classes=2, seed=0)
    assert not hit and len(ds.y) == 10
    assert cache.cached(tmp_path, "tabular", rows=10, features=2, classes=2, seed=0)[1]
    assert not list(tmp_path.glob(".*tmp*"))


def test_benchmark_cases_and_training_sets_share_the_cache(tmp_path, monkeypatch):
    cfg = stage_settings("data", seed=3, tabular_rows=[40], tabular_features=5, image_rows=[6],
                         image_shape=[1, 4, 4], classes=3, digits=True,
                         train={"tabular_rows": 40, "tabular_features": 5, "tabular_classes": 3})
    first = bench.cases(cfg, tmp_path / "cache")
    assert [c.cached for c in first] == [False, False, False]
    for name in ("digits", "tabular", "images"):
        monkeypatch.setattr(datasets, name, lambda **kw: pytest.fail("generated again"))
    second = bench.cases(cfg, tmp_path / "cache")
    assert [c.cached for c in second] == [True, True, True]
    for a, b in zip(first, second):
        assert a.data.name == b.data.name and np.array_equal(a.data.x, b.data.x)
    # digits and the 40x5 tabular set with seed 3, 3 classes: the same entries
    train_sets.build(cfg, tmp_path / "d.h5", tmp_path / "t.h5", tmp_path / "cache")
    assert (tmp_path / "d.h5").exists() and (tmp_path / "t.h5").exists()
