"""Writers and loaders: exact round trips for every format and loader, and every kind of bad input
named by file and line/key."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from gpulab.data import datasets, formats, loaders
from gpulab.data.errors import DataError

CSV_LOADERS = ["pandas", "pandas-chunked", "csv-module"]


@pytest.fixture(scope="module")
def small():
    return datasets.tabular(40, 3, 4, seed=5)


def write(tmp_path, ds, fmt):
    return formats.write(ds, fmt, tmp_path / formats.file_name(ds.name, fmt), batch_rows=16)


@pytest.mark.parametrize("ds", [datasets.tabular(300, 5, 3, seed=1),
                                datasets.images(37, 2, 3, 4, 5, seed=2)], ids=["tabular", "images"])
def test_every_format_and_loader_round_trips_exactly(tmp_path, ds):
    schema = formats.Schema.of(ds)
    seen = set()
    for fmt in formats.FORMATS:
        path = write(tmp_path, ds, fmt)
        for (f, method) in loaders.LOADERS:
            if f != fmt:
                continue
            x, y = loaders.load(path, fmt, schema, method, batch_rows=16)
            assert x.dtype == torch.float32 and y.dtype == torch.int64
            assert torch.equal(x, torch.from_numpy(ds.x)), (fmt, method)
            assert torch.equal(y, torch.from_numpy(ds.y)), (fmt, method)
            seen.add(method)
    assert seen == {m for (_, m) in loaders.LOADERS}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_streaming_loaders_yield_batches_of_batch_rows(tmp_path, small):
    schema = formats.Schema.of(small)
    for fmt, method in [("csv", "pandas-chunked"), ("jsonl", "json-lines"), ("h5", "h5py-chunked")]:
        sizes = [len(b[1]) for b in loaders.LOADERS[(fmt, method)](write(tmp_path, small, fmt), schema, 16)]
        assert sizes == [16, 16, 8], (fmt, method)


def test_synthetic_data_is_deterministic_and_image_like():
    a, b = datasets.images(20, 1, 4, 4, 3, seed=9), datasets.images(20, 1, 4, 4, 3, seed=9)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert a.x.min() >= 0 and a.x.max() <= 1 and np.allclose(a.x * 255, np.round(a.x * 255))
    assert not np.array_equal(a.x, datasets.images(20, 1, 4, 4, 3, seed=10).x)
    with pytest.raises(ValueError, match="rows must be >= 1"):
        datasets.tabular(0, 3, 2, seed=0)


# ---- bad CSV ----------------------------------------------------------------------------------

def edit_line(path, lineno, fn):
    lines = path.read_text().splitlines(keepends=True)
    lines[lineno - 1] = fn(lines[lineno - 1])
    path.write_text("".join(lines))


def csv_file(tmp_path, small, lineno=None, fn=None):
    path = write(tmp_path, small, "csv")
    if lineno:
        edit_line(path, lineno, fn)
    return path


@pytest.mark.parametrize("method", CSV_LOADERS)
def test_csv_row_with_an_extra_field_names_the_line(tmp_path, small, method):
    path = csv_file(tmp_path, small, 30, lambda s: s.rstrip("\n") + ",7\n")
    with pytest.raises(DataError, match=r"\.csv, line 30"):
        loaders.load(path, "csv", formats.Schema.of(small), method, batch_rows=16)


@pytest.mark.parametrize("method", CSV_LOADERS)
def test_csv_row_with_a_missing_field_names_the_line(tmp_path, small, method):
    path = csv_file(tmp_path, small, 7, lambda s: s.split(",", 1)[1])
    with pytest.raises(DataError, match=r"\.csv, line 7"):
        loaders.load(path, "csv", formats.Schema.of(small), method, batch_rows=16)


@pytest.mark.parametrize("method", CSV_LOADERS)
def test_csv_text_in_a_number_column_names_line_and_column(tmp_path, small, method):
    path = csv_file(tmp_path, small, 25, lambda s: "abc," + s.split(",", 1)[1])
    with pytest.raises(DataError, match=r"line 25, key 'f0': value 'abc' is not a number"):
        loaders.load(path, "csv", formats.Schema.of(small), method, batch_rows=16)


@pytest.mark.parametrize("method", CSV_LOADERS)
def test_csv_nan_label_names_line_and_label(tmp_path, small, method):
    path = csv_file(tmp_path, small, 12, lambda s: s.rsplit(",", 1)[0] + ",\n")
    with pytest.raises(DataError, match=r"line 12, key 'label': label is NaN"):
        loaders.load(path, "csv", formats.Schema.of(small), method, batch_rows=16)


@pytest.mark.parametrize("method", CSV_LOADERS)
def test_csv_fractional_label(tmp_path, small, method):
    path = csv_file(tmp_path, small, 5, lambda s: s.rsplit(",", 1)[0] + ",1.5\n")
    with pytest.raises(DataError, match=r"line 5, key 'label': label .*1\.5.* not a whole number"):
        loaders.load(path, "csv", formats.Schema.of(small), method, batch_rows=16)


@pytest.mark.parametrize("method", CSV_LOADERS)
def test_csv_missing_column_names_the_header(tmp_path, small, method):
    path = csv_file(tmp_path, small, 1, lambda s: s.replace("f2", "g2"))
    with pytest.raises(DataError, match=r"line 1, key 'f2': missing column"):
        loaders.load(path, "csv", formats.Schema.of(small), method)


@pytest.mark.parametrize("method", CSV_LOADERS)
def test_csv_empty_file(tmp_path, small, method):
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(DataError, match=r"empty\.csv, line 1: empty file"):
        loaders.load(path, "csv", formats.Schema.of(small), method)


# ---- bad JSON ---------------------------------------------------------------------------------

def test_truncated_json_names_the_line(tmp_path, small):
    path = write(tmp_path, small, "json")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    line = text[: len(text) // 2].count("\n") + 1
    with pytest.raises(DataError, match=rf"\.json, line {line}: truncated JSON"):
        loaders.load(path, "json", formats.Schema.of(small))


def test_truncated_json_lines_names_the_last_line(tmp_path, small):
    path = write(tmp_path, small, "jsonl")
    path.write_text(path.read_text()[:-20])
    with pytest.raises(DataError, match=r"\.jsonl, line 40: truncated JSON"):
        loaders.load(path, "jsonl", formats.Schema.of(small), batch_rows=16)


def records(path):
    return [json.loads(s) for s in path.read_text().strip("[]\n").split(",\n")]


def test_json_wrong_dtype_names_record_and_key(tmp_path, small):
    path = write(tmp_path, small, "json")
    recs = records(path)
    recs[3]["f1"] = "0.5"  # a string where a number belongs
    path.write_text(json.dumps(recs))
    with pytest.raises(DataError, match=r"key '\[3\]\.f1': value '0\.5' is not a number"):
        loaders.load(path, "json", formats.Schema.of(small))


def test_json_null_label_and_missing_key(tmp_path, small):
    path = write(tmp_path, small, "json")
    recs = records(path)
    recs[8]["label"] = None
    path.write_text(json.dumps(recs))
    with pytest.raises(DataError, match=r"key '\[8\]\.label': label is NaN"):
        loaders.load(path, "json", formats.Schema.of(small))
    recs[8]["label"] = 1
    del recs[9]["f0"]
    path.write_text(json.dumps(recs))
    with pytest.raises(DataError, match=r"key '\[9\]\.f0': missing value"):
        loaders.load(path, "json", formats.Schema.of(small))
    for r in recs:
        r.pop("f0", None)
    path.write_text(json.dumps(recs))
    with pytest.raises(DataError, match=r"key 'f0': missing column"):
        loaders.load(path, "json", formats.Schema.of(small))


def test_json_lines_bool_and_not_an_object(tmp_path, small):
    path = write(tmp_path, small, "jsonl")
    edit_line(path, 21, lambda s: s.replace('"f2": ', '"f2": true, "x": '))
    with pytest.raises(DataError, match=r"line 21, key 'f2': value True is not a number"):
        loaders.load(path, "jsonl", formats.Schema.of(small), batch_rows=16)
    edit_line(path, 21, lambda s: "[1, 2]\n")
    with pytest.raises(DataError, match=r"line 21: record is a list, not an object"):
        loaders.load(path, "jsonl", formats.Schema.of(small), batch_rows=16)
    path.write_text('{"a": 1}')
    with pytest.raises(DataError, match="top level is a dict"):
        loaders.load(path.rename(path.with_suffix(".json")), "json", formats.Schema.of(small))


# ---- bad HDF5 ---------------------------------------------------------------------------------

def test_hdf5_missing_dataset_and_missing_file(tmp_path, small):
    path = write(tmp_path, small, "h5")
    with h5py.File(path, "a") as f:
        del f["y"]
    for method in ("h5py-whole", "h5py-chunked"):
        with pytest.raises(DataError, match=r"\.hdf5, key 'y': no dataset 'y'"):
            loaders.load(path, "h5", formats.Schema.of(small), method)
    with pytest.raises(DataError, match="nothing.hdf5: file does not exist"):
        loaders.load(tmp_path / "nothing.hdf5", "h5", formats.Schema.of(small))


def test_hdf5_truncated_file(tmp_path, small):
    path = write(tmp_path, small, "h5")
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError, match="not a readable HDF5 file"):
        loaders.load(path, "h5", formats.Schema.of(small))


def test_hdf5_corrupt_compressed_chunk_names_the_dataset(tmp_path, small):
    path = write(tmp_path, small, "h5-gzip")
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(1)
    raw = bytearray(path.read_bytes())
    raw[info.byte_offset: info.byte_offset + info.size] = b"\xff" * info.size
    path.write_bytes(bytes(raw))
    for method in ("h5py-whole", "h5py-chunked"):
        with pytest.raises(DataError, match=r"key 'x': corrupt data"):
            loaders.load(path, "h5-gzip", formats.Schema.of(small), method, batch_rows=16)


def test_hdf5_nan_label_wrong_dtype_and_shape(tmp_path, small):
    schema = formats.Schema.of(small)
    path = tmp_path / "nan.hdf5"
    y = small.y.astype(np.float64)
    y[17] = np.nan
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = small.x, y
    for method in ("h5py-whole", "h5py-chunked"):
        with pytest.raises(DataError, match=r"key 'y\[17\]': label is NaN"):
            loaders.load(path, "h5", schema, method, batch_rows=16)
    with h5py.File(path, "w") as f:
        f["x"] = np.array([["a"] * 3] * 40, dtype=h5py.string_dtype())
        f["y"] = small.y
    with pytest.raises(DataError, match=r"key 'x\[0\]': features have dtype object"):
        loaders.load(path, "h5", schema)
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = small.x[:, :2], small.y
    with pytest.raises(DataError, match=r"key 'x': samples have shape \(2,\), expected \(3,\)"):
        loaders.load(path, "h5", schema)


# ---- writers and files from elsewhere ----------------------------------------------------------

def test_failed_write_leaves_nothing(tmp_path, small, monkeypatch):
    def boom(ds):
        raise RuntimeError("disk full")

    monkeypatch.setattr(formats, "csv_text", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        write(tmp_path, small, "csv")
    with pytest.raises(ValueError, match="unknown data format 'xml'"):
        formats.write(small, "xml", tmp_path / "a.xml")
    assert list(tmp_path.iterdir()) == []


def test_infer_schema_of_external_files(tmp_path, small):
    for fmt in ("csv", "json", "jsonl", "h5"):
        path = write(tmp_path, small, fmt)
        schema = loaders.infer_schema(path, loaders.format_of(path))
        x, y = loaders.load(path, fmt, schema)
        assert torch.equal(x.reshape(len(x), -1), torch.from_numpy(small.x)) and len(y) == 40
    with pytest.raises(DataError, match=r"line 1, key 'target': no label column in the header"):
        loaders.infer_schema(tmp_path / formats.file_name(small.name, "csv"), "csv", label="target")
    with pytest.raises(DataError, match="unknown file type '.parquet'"):
        loaders.format_of("a.parquet")


def test_malformed_json_in_the_middle_names_its_line(tmp_path, small):
    path = write(tmp_path, small, "json")
    edit_line(path, 10, lambda s: s.replace(":", "", 1))
    with pytest.raises(DataError, match=r"\.json, line 10: malformed JSON: Expecting ':'"):
        loaders.load(path, "json", formats.Schema.of(small))
