"""How a GEMM is cut up over P devices: padding, the 2D grid, SUMMA's k panels. Pure arithmetic.

Sizes that do not divide evenly are padded with zeros (rows of A, columns of B, the k dimension).
Zero padding adds exact zeros to C, so the error check over padded pieces equals the check over the
real matrix; TFLOP/s always counts the unpadded 2*M*N*K.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def ceil_to(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def grid_shape(p: int) -> tuple[int, int]:
    """The most square grid rows x cols = p with rows <= cols (1x1, 1x2, 2x2, 2x3, 2x4, 1x7...)."""
    if p < 1:
        raise ValueError(f"a device grid needs at least 1 device, got {p}")
    rows = max(r for r in range(1, math.isqrt(p) + 1) if p % r == 0)
    return rows, p // rows


@dataclass(frozen=True)
class RowPlan:
    """1D row decomposition: rank r owns rows [r*mb, (r+1)*mb) of A and C, all of B."""

    m: int
    n: int
    k: int
    p: int

    @property
    def mb(self) -> int:
        return ceil_to(self.m, self.p) // self.p

    @property
    def m_pad(self) -> int:
        return self.mb * self.p


@dataclass(frozen=True)
class SummaPlan:
    """SUMMA on a rows x cols grid: rank (i, j) owns block (i, j) of A (M x K), B (K x N) and C.

    A's k dimension is cut into ``cols`` blocks, B's into ``rows`` blocks; the k loop runs over
    ``panels`` panels of width ``w``, a multiple of lcm(rows, cols) panels so that every panel sits
    inside one block column of A and one block row of B (a single owner broadcasts it).
    """

    m: int
    n: int
    k: int
    rows: int
    cols: int
    min_panels: int = 1

    @property
    def p(self) -> int:
        return self.rows * self.cols

    @property
    def panels(self) -> int:
        step = math.lcm(self.rows, self.cols)
        return min(ceil_to(max(self.min_panels, 1), step), ceil_to(self.k, step))

    @property
    def k_pad(self) -> int:
        return ceil_to(self.k, self.panels)

    @property
    def w(self) -> int:
        return self.k_pad // self.panels

    @property
    def mb(self) -> int:
        return ceil_to(self.m, self.rows) // self.rows

    @property
    def nb(self) -> int:
        return ceil_to(self.n, self.cols) // self.cols

    @property
    def kb_a(self) -> int:  # width of a block column of A
        return self.k_pad // self.cols

    @property
    def kb_b(self) -> int:  # height of a block row of B
        return self.k_pad // self.rows

    def coords(self, rank: int) -> tuple[int, int]:
        return divmod(rank, self.cols)

    def a_owner(self, panel: int) -> tuple[int, int]:
        """(grid column owning panel's columns of A, offset inside that block)."""
        start = panel * self.w
        return start // self.kb_a, start % self.kb_a

    def b_owner(self, panel: int) -> tuple[int, int]:
        """(grid row owning panel's rows of B, offset inside that block)."""
        start = panel * self.w
        return start // self.kb_b, start % self.kb_b


def summa_plan(m: int, n: int, k: int, p: int, min_panels: int = 1) -> SummaPlan:
    rows, cols = grid_shape(p)
    return SummaPlan(m, n, k, rows, cols, min_panels)
