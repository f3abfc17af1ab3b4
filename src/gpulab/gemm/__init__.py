"""Multi-device GEMM: single-device baseline, 1D row decomposition, SUMMA and overlapped SUMMA.

Writes ``results/gemm/<host>/main.h5`` with tables ``single``, ``multi``, ``scaling``, ``bars``,
``checks`` and ``not_applicable`` (what was not measured here and why). See :mod:`gpulab.gemm.runner`.
"""
from gpulab.gemm.runner import run

__all__ = ["run"]
