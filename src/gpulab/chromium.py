"""Where Chromium is, if anywhere: light enough for the Snakefile to ask at parse time.

:mod:`gpulab.report.browser` drives Chromium; it lives in the report package, whose import pulls in
the plotting stack, which `snakemake --lint` and every dry run should not pay for.
"""
from __future__ import annotations

import os
import shutil

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a Chromium binary; $GPULAB_CHROMIUM overrides (set it empty to disable)."""
    env = os.environ.get("GPULAB_CHROMIUM")
    if env is not None:
        return shutil.which(env) if env else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)
