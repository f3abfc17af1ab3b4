"""Multi-device GEMM: torch.matmul baseline (fp32/tf32/bf16), 1D row, SUMMA and overlapped SUMMA
over NCCL (GPUs) or gloo (CPU ranks); TFLOP/s, compute/communication split, strong scaling,
relative error against float64.
"""
from gpulab.gemm import run
from gpulab.stage import stage_main

if __name__ == "__main__":
    raise SystemExit(stage_main("gemm", run, __doc__))
