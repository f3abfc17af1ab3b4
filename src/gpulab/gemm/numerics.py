"""Precisions, error bounds, random inputs and the error check every GEMM result goes through.

A precision name says both the storage dtype and how the matrix unit may compute:

- ``fp32``: fp32 inputs, IEEE fp32 arithmetic (TF32 explicitly off).
- ``tf32``: fp32 inputs, the matrix unit may round them to TF32 (10-bit mantissa); CUDA only.
- ``bf16`` / ``fp16``: inputs and output in that dtype, accumulation as cuBLAS/oneDNN choose.

The error is ``||C - C_ref||_F / ||C_ref||_F`` with ``C_ref`` computed in float64 from the *same*
(already rounded) inputs, so it measures the GEMM's arithmetic, not the rounding of the inputs.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

TFLOP = 1e12


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype
    tf32: bool  # allow TF32 on the matrix unit (fp32 storage)
    bound: float  # relative Frobenius error accepted against the float64 reference
    cuda_only: bool = False


# Bounds: about 10-20x the error seen on random normal data, so a real bug (a wrong panel, a
# missing block) fails by orders of magnitude while honest rounding never does. fp32 errors grow
# ~ u*sqrt(K) (u = 6e-8); TF32 rounds inputs to 2^-11; bf16/fp16 round the output (and SUMMA's
# partial sums) to 2^-9 / 2^-12.
PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", torch.float32, False, 1e-5),
    "tf32": Precision("tf32", torch.float32, True, 2e-3, cuda_only=True),
    "bf16": Precision("bf16", torch.bfloat16, False, 1e-2),
    "fp16": Precision("fp16", torch.float16, False, 2e-3),
}


def precision(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r} (known: {', '.join(PRECISIONS)})") from None


@contextlib.contextmanager
def matmul_mode(prec: Precision):
    """Allow TF32 for fp32 matmuls only inside a ``tf32`` measurement (and force it off otherwise).

    ``set_float32_matmul_precision`` is the one switch that means the same in every torch version
    we meet (the newer ``fp32_precision`` attributes must not be mixed with ``allow_tf32``).
    """
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if prec.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def unsupported_reason(prec: Precision, device: torch.device) -> str | None:
    """Why ``prec`` cannot run on ``device`` (None when it can): a tiny real matmul decides."""
    if prec.cuda_only and device.type != "cuda":
        return f"{prec.name} needs a CUDA GPU's matrix units"
    try:
        a = torch.ones(8, 8, dtype=prec.dtype, device=device)
        torch.matmul(a, a)
    except (RuntimeError, TypeError) as exc:
        return f"{prec.name} matmul not supported on {device.type}: {exc}"
    return None


def flops(m: int, n: int, k: int) -> float:
    """Floating-point operations of one GEMM, counted as 2*M*N*K (a multiply and an add)."""
    return 2.0 * m * n * k


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    return flops(m, n, k) / seconds / TFLOP if seconds > 0 else float("nan")


def random_inputs(m: int, n: int, k: int, seed: int, device: torch.device):
    """A (MxK) and B (KxN), standard normal fp32, the same on every rank for the same seed."""
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=g, device=device, dtype=torch.float32)
    b = torch.randn(k, n, generator=g, device=device, dtype=torch.float32)
    return a, b


def error_terms(c: torch.Tensor, ref64: torch.Tensor) -> tuple[float, float]:
    """(||C - ref||_F^2, ||ref||_F^2) of one piece of C: pieces add up to the whole matrix."""
    diff = c.to(torch.float64) - ref64
    return float((diff * diff).sum()), float((ref64 * ref64).sum())


def relative_error(err_sq: float, ref_sq: float) -> float:
    if ref_sq <= 0:
        raise ValueError("reference has zero norm: inputs must be random, not zeros")
    return (err_sq / ref_sq) ** 0.5
