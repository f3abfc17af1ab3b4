"""Findings of the GEMM stage (rules: see gpulab.findings)."""
from __future__ import annotations

from gpulab.findings import Finding, NotMeasurable, Rows, energy_rule


def fastest_dtype(rows: Rows):
    """The fastest precision at the largest single-device GEMM, against the slowest."""
    df = rows.table("single")
    if df.empty or df["dtype"].nunique() < 2:
        return NotMeasurable("gemm.fastest_dtype", "fewer than two precisions measured")
    vol = df["M"] * df["N"] * df["K"]
    d = df[vol == vol.max()]
    d = d[d.groupby("dtype")["tflops_median"].transform("max") == d["tflops_median"]]
    if d["dtype"].nunique() < 2:
        return NotMeasurable("gemm.fastest_dtype", "fewer than two precisions at the largest size")
    hi, lo = d.loc[d["tflops_median"].idxmax()], d.loc[d["tflops_median"].idxmin()]
    x = float(hi["tflops_median"]) / float(lo["tflops_median"])
    size = f"{int(hi['M'])}x{int(hi['N'])}x{int(hi['K'])}"
    return Finding(
        "gemm.fastest_dtype",
        f"{hi['dtype']} GEMM is {x:.1f}x faster than {lo['dtype']} at {size} "
        f"({hi['tflops_median']:.4g} vs {lo['tflops_median']:.4g} TFLOP/s)",
        {"fast_tflops": float(hi["tflops_median"]), "slow_tflops": float(lo["tflops_median"]),
         "speedup": x},
        [rows.ref("single", M=int(r["M"]), N=int(r["N"]), K=int(r["K"]), dtype=r["dtype"])
         for r in (hi, lo)],
        "torch.matmul(out=) on one device, median per-call time; each output checked against float64")


def gemm_energy(rows: Rows):
    """GFLOP/J of the bf16 GEMM, from the energy table."""
    return energy_rule("gemm.gemm_energy", rows, "GFLOP")


RULES = [fastest_dtype, gemm_energy]
