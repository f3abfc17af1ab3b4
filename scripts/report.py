"""Render every result into the paper-style report: self-contained HTML, and a PDF via Chromium.

Reads the HDF5 files given with --inputs plus any other result already under --results-dir (results
copied from other hosts appear side by side). Logic lives in gpulab.report.
"""
import sys

from gpulab.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
