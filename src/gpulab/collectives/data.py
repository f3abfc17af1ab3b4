"""Random integer-valued float32 data that every rank can rebuild for any other rank.

Rank r's buffer holds ``x_r[i] = P_r[i mod PERIOD]`` where ``P_r`` is a random vector of small
integers drawn on the host from a seed fixed by (seed, rank). The period is a prime, so it never
lines up with chunk boundaries and a misplaced chunk is caught. Because every rank can rebuild every
``P_j`` cheaply, each rank computes the exact expected result of a collective locally, and float32
sums of small integers are exact (|sum| << 2**24), so results are compared with equality.
"""
from __future__ import annotations

import numpy as np

PERIOD = 1_000_003  # prime
LIMIT = 64  # values in [-LIMIT, LIMIT]: a sum over up to 2**17 ranks stays exact in float32
WEIGHTS = -1  # pseudo-rank of the parameter server's initial weights


class Patterns:
    """The per-rank random patterns on one device, built once per worker."""

    def __init__(self, seed: int, world_size: int, device):
        import torch

        self.device = device
        self.n = world_size
        self._p = {}
        for r in list(range(world_size)) + [WEIGHTS]:
            rng = np.random.default_rng([int(seed), r + 1])
            vals = rng.integers(-LIMIT, LIMIT + 1, size=PERIOD).astype(np.float32)
            self._p[r] = torch.from_numpy(vals).to(device)
        self.sum = sum(self._p[r] for r in range(world_size))

    def of(self, rank: int):
        return self._p[rank]

    def tile(self, pattern, start: int, stop: int):
        """Elements [start, stop) of the infinite repetition of ``pattern``."""
        import torch

        length = stop - start
        if length <= 0:
            return torch.empty(0, dtype=pattern.dtype, device=self.device)
        rolled = torch.roll(pattern, -(start % PERIOD))
        reps = -(-length // PERIOD)
        return rolled.repeat(reps)[:length] if reps > 1 else rolled[:length].clone()

    def rank_buffer(self, rank: int, numel: int, start: int = 0):
        return self.tile(self.of(rank), start, start + numel)

    def sum_buffer(self, numel: int, start: int = 0):
        return self.tile(self.sum, start, start + numel)


def compare(out, expected) -> int:
    """Number of wrong elements (0 = exact); a length mismatch counts every element as wrong."""
    if out.shape != expected.shape:
        return int(max(out.numel(), expected.numel()))
    return int((out != expected).sum().item())
