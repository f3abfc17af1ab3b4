"""Data loading benchmark: datasets (digits, synthetic tabular and image-like) written as CSV, JSON,
JSON lines and chunked HDF5 (plain and compressed), loaded into torch tensors by pandas, csv, json
and h5py; load time, MB/s, rows/s, time to first batch, file size, peak memory, exact round trip.

Writes the HDF5 result given by --out and the data files to --files-dir. CPU-only.
"""
from gpulab.data.stage import main

if __name__ == "__main__":
    raise SystemExit(main(__doc__))
