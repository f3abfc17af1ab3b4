"""The plotting stack every figure is drawn with: matplotlib on its file-only backend, and seaborn.

    from gpulab.kit.plotting import plt, sns

One place, because two things must happen before the first import of pyplot or seaborn:
- the Agg backend (a report job has no display);
- seaborn without its optional scipy. seaborn imports ``scipy.stats`` (and ``scipy.cluster``) at
  import time for kernel density estimates and clustermaps, which gpulab never draws; that import
  alone cost about 1 CPU-second of the ~2.9 each report job takes (8 chapter jobs per run, on the
  2-core CI machine). seaborn supports running without scipy (its own KDE, clustermap refused), so
  the two modules are hidden while seaborn loads, and put back at once for anyone who imports them
  later (gpulab.baseline's Mann-Whitney test does).
"""
from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SCIPY_SEABORN_SKIPS = ("scipy.stats", "scipy.cluster")


def _seaborn_without_scipy():
    if "seaborn" in sys.modules or any(m in sys.modules for m in SCIPY_SEABORN_SKIPS):
        import seaborn  # already paid for (or already loaded): nothing to save

        return seaborn
    saved = {m: sys.modules.get(m) for m in SCIPY_SEABORN_SKIPS}
    try:
        for m in SCIPY_SEABORN_SKIPS:
            sys.modules[m] = None  # an import of it raises ImportError: seaborn's fallback path
        import seaborn
    finally:
        for m, mod in saved.items():
            if mod is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = mod
    return seaborn


sns = _seaborn_without_scipy()

__all__ = ["plt", "sns"]
