"""Multi-device GEMM: single-device baseline, 1D row decomposition, SUMMA and overlapped SUMMA.

Writes ``results/gemm/<host>/main.h5`` with tables ``single``, ``multi``, ``scaling``, ``bars`` and
``coverage`` (what was not applicable here and why). See :mod:`gpulab.gemm.runner`.
"""
from gpulab.gemm.runner import run

__all__ = ["run"]
