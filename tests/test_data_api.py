"""The training-set interface: write_training_set, H5Dataset (workers, pickling, sharding)."""
from __future__ import annotations

import os
import pickle

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from conftest import stage_settings
from gpulab import launch
from gpulab.data import api, datasets
from gpulab.data.errors import DataError

CLASSES = 5


def id_set(path, n=103, shape=(2, 3)):
    """x[i] is random except x[i].flat[0] == i, and y[i] == i % CLASSES: every sample is identifiable."""
    rng = np.random.default_rng(7)
    x = rng.random((n, *shape), dtype=np.float32)
    x.reshape(n, -1)[:, 0] = np.arange(n)
    y = np.arange(n) % CLASSES
    api.write_training_set(path, x, y, {"name": "ids"})
    return x, y


def test_write_read_round_trip_is_exact(tmp_path):
    x, y = id_set(tmp_path / "s.h5")
    x2, y2, meta = api.read_training_set(tmp_path / "s.h5")
    assert x2.dtype == np.float32 and y2.dtype == np.int64
    assert np.array_equal(x2, x) and np.array_equal(y2, y)
    assert meta["num_classes"] == CLASSES and meta["sample_shape"] == [2, 3] and meta["name"] == "ids"
    assert [p.name for p in tmp_path.iterdir()] == ["s.h5"]  # no temporary left behind


def test_dataset_items_and_batches(tmp_path):
    x, y = id_set(tmp_path / "s.h5")
    ds = api.H5Dataset(tmp_path / "s.h5")
    assert len(ds) == 103 and ds.sample_shape == (2, 3) and ds.num_classes == CLASSES
    xi, yi = ds[10]
    assert xi.dtype == torch.float32 and yi.dtype == torch.int64 and yi.shape == ()
    assert torch.equal(xi, torch.from_numpy(x[10])) and int(yi) == y[10]
    assert torch.equal(ds[-1][0], torch.from_numpy(x[-1]))
    with pytest.raises(IndexError, match="index 103 out of range"):
        ds[103]
    # unsorted, repeated indices come back in the order asked for
    batch = ds.__getitems__([5, 2, 5, 0])
    assert [int(b[1]) for b in batch] == [y[5], y[2], y[5], y[0]]
    assert torch.equal(batch[1][0], torch.from_numpy(x[2]))


def test_transform_is_applied(tmp_path):
    x, _ = id_set(tmp_path / "s.h5")
    ds = api.H5Dataset(tmp_path / "s.h5", transform=lambda t: t * 2)
    assert torch.equal(ds[3][0], torch.from_numpy(x[3]) * 2)


def test_pickle_drops_the_open_handle(tmp_path):
    id_set(tmp_path / "s.h5")
    ds = api.H5Dataset(tmp_path / "s.h5")
    ds[0]
    assert ds._file is not None
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._file is None and torch.equal(clone[4][0], ds[4][0])


def test_forked_workers_read_everything_once(tmp_path):
    x, y = id_set(tmp_path / "s.h5")
    ds = api.H5Dataset(tmp_path / "s.h5")
    ds[0]  # the parent holds an open handle before forking: workers must not use it
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2,
                        multiprocessing_context="fork", generator=torch.Generator().manual_seed(0))
    xs, ys = zip(*loader)
    xs, ys = torch.cat(xs), torch.cat(ys)
    order = xs.reshape(len(xs), -1)[:, 0].long()
    assert sorted(order.tolist()) == list(range(len(x)))
    assert torch.equal(xs[order.argsort()], torch.from_numpy(x))
    assert torch.equal(ys[order.argsort()], torch.from_numpy(y))
    assert ds._pid == os.getpid()


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("n", [96, 103])
def test_distributed_sampler_index_sets_are_disjoint(tmp_path, world, n):
    """The index sets ranks get: disjoint, and covering everything when N divides evenly
    (otherwise DistributedSampler pads with repeats unless drop_last=True)."""
    id_set(tmp_path / "s.h5", n=n)
    ds = api.H5Dataset(tmp_path / "s.h5")
    drop_last = n % world != 0
    shards = [list(DistributedSampler(ds, world, r, shuffle=True, seed=3, drop_last=drop_last))
              for r in range(world)]
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) and len({len(s) for s in shards}) == 1
    if not drop_last:
        assert set(flat) == set(range(n))
    else:
        assert len(flat) == n - n % world


@pytest.mark.slow
def test_three_gloo_ranks_read_disjoint_shards(tmp_path):
    """Real ranks, real reads through DataLoader workers: each sample read by exactly one rank."""
    x, _ = id_set(tmp_path / "s.h5", n=96)
    res = launch.run_workers("gpulab.data.shard_check",
                             {"path": str(tmp_path / "s.h5"), "num_workers": 1, "backend": "gloo"}, 3)
    assert all(r["disjoint"] and r["complete"] and r["labels_ok"] for r in res)
    assert sorted(i for r in res for i in r["ids"]) == list(range(96))
    assert [r["sampler_len"] for r in res] == [32, 32, 32]


def test_write_rejects_bad_arrays_and_leaves_nothing(tmp_path):
    p = tmp_path / "bad.h5"
    x = np.ones((4, 3), np.float32)
    with pytest.raises(DataError, match=r"bad\.h5, key 'y': label 2 is NaN"):
        api.write_training_set(p, x, np.array([0, 1, np.nan, 1]))
    with pytest.raises(DataError, match="4 feature rows but 3 labels"):
        api.write_training_set(p, x, np.array([0, 1, 1]))
    with pytest.raises(DataError, match="sample 1 has a NaN"):
        api.write_training_set(p, np.array([[0.0], [np.inf]]), np.array([0, 1]))
    with pytest.raises(DataError, match="need a floating type"):
        api.write_training_set(p, np.ones((2, 2), np.int32), np.array([0, 1]))
    with pytest.raises(DataError, match="label 0 is negative"):
        api.write_training_set(p, x, np.array([-1, 0, 1, 1]))
    assert list(tmp_path.iterdir()) == []


def test_open_names_missing_file_and_key(tmp_path):
    with pytest.raises(DataError, match="nope.h5: file does not exist"):
        api.H5Dataset(tmp_path / "nope.h5")
    with h5py.File(tmp_path / "nox.h5", "w") as f:
        f["y"] = np.zeros(3, np.int64)
    with pytest.raises(DataError, match=r"nox\.h5, key 'x': no dataset 'x'"):
        api.H5Dataset(tmp_path / "nox.h5")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(DataError, match="junk.h5: not a readable HDF5 file"):
        api.H5Dataset(tmp_path / "junk.h5")


def test_training_sets_have_the_agreed_layout(tmp_path):
    from gpulab.data import train_sets

    cfg = stage_settings("data", seed=1,
                         train={"tabular_rows": 300, "tabular_features": 7, "tabular_classes": 3})
    train_sets.build(cfg, tmp_path / "digits.h5", tmp_path / "tabular.h5")
    d = api.H5Dataset(tmp_path / "digits.h5")
    assert len(d) == 1797 and d.sample_shape == (1, 8, 8) and d.num_classes == 10
    x, y, _ = api.read_training_set(tmp_path / "digits.h5")
    assert x.min() == 0.0 and x.max() == 1.0 and set(np.unique(y)) == set(range(10))
    t = api.H5Dataset(tmp_path / "tabular.h5")
    assert len(t) == 300 and t.sample_shape == (7,) and t.num_classes == 3
    # deterministic: the same config gives the same bytes
    again = datasets.tabular(300, 7, 3, seed=1)
    tx, ty, _ = api.read_training_set(tmp_path / "tabular.h5")
    assert np.array_equal(tx, again.x) and np.array_equal(ty, again.y)
    assert len(np.unique(ty)) == 3  # every class present
