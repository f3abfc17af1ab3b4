"""Multi-device GEMM: single-device baseline, 1D row decomposition, SUMMA and overlapped SUMMA.

Writes ``results/gemm/<host>/main.h5`` with tables ``single``, ``multi``, ``scaling``, ``bars``,
``checks`` and ``not_applicable`` (what was not measured here and why). See :mod:`gpulab.gemm.runner`.
"""

__all__ = ["run"]


def __getattr__(name: str):
    # The runner imports torch (2 s). The report imports this package for its findings and
    # section alone, so the runner loads only when a job asks for ``run``.
    if name == "run":
        from gpulab.gemm.runner import run
        return run
    raise AttributeError(f"module 'gpulab.gemm' has no attribute {name!r}")
