import json
import os

import h5py
import numpy as np
import pandas as pd
import pytest

from gpulab import results


def _result():
    r = results.Result("transfer", "p2p", {"sizes": [1, 2]}, "cpu")
    r.add_table("bw", pd.DataFrame({"src": [0, 1], "dst": [1, 0], "gbps": [10.5, 11.25],
                                    "mode": ["ce", "sm"], "ok": [True, False]}),
                units={"gbps": "GB/s"})
    r.add_matrix("uni", np.array([[1.0, 2.0], [3.0, 4.0]]), "GB/s", rows=["GPU0", "GPU1"],
                 cols=["GPU0", "GPU1"])
    r.add_matrix("links", np.array([["X", "NV4"], ["NV4", "X"]]), "link type")
    return r


def test_roundtrip_with_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE_IDS", "0,1")
    p = results.write(_result(), tmp_path / "a" / "r.h5")
    a = results.read_attrs(p)
    for key in ("schema_version", "stage", "config", "config_hash", "git_commit", "git_dirty",
                "packages", "host_fingerprint", "device_ids", "started_at", "finished_at",
                "result_id", "device_kind"):
        assert key in a, key
    assert a["config"] == {"sizes": [1, 2]} and a["device_ids"] == "0,1"
    assert a["stage"] == "transfer" and a["schema_version"] == results.SCHEMA_VERSION
    assert "torch" in a["packages"]
    df = results.read_table(p, "bw")
    assert df["gbps"].tolist() == [10.5, 11.25] and df["mode"].tolist() == ["ce", "sm"]
    assert df["ok"].tolist() == [True, False] and df.attrs["units"] == {"gbps": "GB/s"}
    m, meta = results.read_matrix(p, "uni")
    assert m.tolist() == [[1.0, 2.0], [3.0, 4.0]] and meta["unit"] == "GB/s"
    assert meta["rows"] == ["GPU0", "GPU1"]
    links, _ = results.read_matrix(p, "links")
    assert links.tolist() == [["X", "NV4"], ["NV4", "X"]]


def test_collect_adds_identity_columns(tmp_path):
    p1 = results.write(_result(), tmp_path / "x" / "1.h5")
    p2 = results.write(_result(), tmp_path / "y" / "2.h5")
    df = results.collect([p1, p2], "bw")
    assert len(df) == 4 and set(df["host"]) == {results.host_name()}
    assert set(df.columns) >= {"stage", "variant", "device_kind", "result_id"}
    assert results.find_results(tmp_path) == sorted([p1, p2])


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "r.h5"
    real = results._write_table

    def boom(group, df):
        real(group, df)
        raise KeyboardInterrupt  # the job is interrupted mid-write

    monkeypatch.setattr(results, "_write_table", boom)
    with pytest.raises(KeyboardInterrupt):
        results.write(_result(), target)
    assert list(tmp_path.iterdir()) == []


def test_existing_result_survives_failed_rewrite(tmp_path, monkeypatch):
    target = results.write(_result(), tmp_path / "r.h5")
    before = results.read_attrs(target)["result_id"]
    monkeypatch.setattr(results, "_write_table", lambda g, d: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError):
        results.write(_result(), target)
    assert results.read_attrs(target)["result_id"] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]


def test_missing_table_names_file(tmp_path):
    p = results.write(_result(), tmp_path / "r.h5")
    with pytest.raises(KeyError, match="no table 'nope'"):
        results.read_table(p, "nope")


def test_atomic_text(tmp_path):
    p = results.atomic_write_text(tmp_path / "s" / "x.json", json.dumps({"a": 1}))
    assert json.loads(p.read_text()) == {"a": 1}
    assert [f.name for f in p.parent.iterdir()] == ["x.json"]
