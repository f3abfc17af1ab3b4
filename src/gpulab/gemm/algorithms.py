"""The multi-device GEMM algorithms, written once for NCCL (GPUs) and gloo (CPU ranks).

- :func:`row1d`: 1D row decomposition. A and B start on the team's first rank: scatter row blocks
  of A, broadcast B, multiply locally, gather the row blocks of C back to the first rank.
- :func:`summa`: SUMMA on a rows x cols grid with A, B and C block-distributed. For every k panel
  the owner column broadcasts its panel of A along each grid row, the owner row its panel of B
  along each grid column, and every rank adds the panel product into its block of C.
  ``overlap=True`` double-buffers the panels and issues panel l+1's broadcasts asynchronously
  before computing panel l, so communication runs behind the GEMM (NCCL runs async collectives on
  its own stream; gloo on its own threads).

Each algorithm marks its local GEMMs through :class:`Segments`; time outside them is exposed
communication (including waiting for slower ranks).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


class Segments:
    """Total and compute time of one run: CUDA events on the current stream, else the host clock.

    Collectives called without ``async_op`` make the current stream wait for them, so events on
    the current stream see communication and compute in the order the GPU executes them.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._spans: list[tuple[Any, Any]] = []
        self._begin = self._end = None

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _seconds(self, t0, t1) -> float:
        return t0.elapsed_time(t1) / 1e3 if self.cuda else t1 - t0

    def begin(self) -> None:
        self._begin = self._mark()

    def end(self) -> None:
        self._end = self._mark()

    @contextlib.contextmanager
    def compute(self):
        t0 = self._mark()
        yield
        self._spans.append((t0, self._mark()))

    def times(self) -> tuple[float, float]:
        """(total, compute) seconds; waits for the device first."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        total = self._seconds(self._begin, self._end)
        return total, sum(self._seconds(a, b) for a, b in self._spans)


@dataclass
class Team:
    """The first ``p`` ranks of the world, with SUMMA's grid row and column groups.

    ``rank`` is this process's place in the team (-1: not a member; it sits this one out). A group
    of one rank is never created: its "broadcast" is the local data.
    """

    p: int
    rank: int
    group: Any
    rows: int
    cols: int
    row_group: Any = None
    col_group: Any = None
    row_ranks: list[int] = field(default_factory=list)  # global ranks of my grid row, by column
    col_ranks: list[int] = field(default_factory=list)  # global ranks of my grid column, by row

    @property
    def member(self) -> bool:
        return self.rank >= 0

    @property
    def coords(self) -> tuple[int, int]:
        return divmod(self.rank, self.cols)


def make_team(p: int, world: int, me: int, rows: int, cols: int) -> Team:
    """Create the team's process groups. Every rank must call this, in the same order."""
    group = dist.group.WORLD if p == world else dist.new_group(list(range(p)))
    team = Team(p, me if me < p else -1, group, rows, cols)
    # new_group must be entered by all ranks for every group, members or not.
    for i in range(rows):
        ranks = [i * cols + j for j in range(cols)]
        g = dist.new_group(ranks) if cols > 1 else None
        if team.rank in ranks:
            team.row_group, team.row_ranks = g, ranks
    for j in range(cols):
        ranks = [i * cols + j for i in range(rows)]
        g = dist.new_group(ranks) if rows > 1 else None
        if team.rank in ranks:
            team.col_group, team.col_ranks = g, ranks
    return team


def row1d(team: Team, a_full, b, a_loc, c_loc, c_full, seg: Segments) -> None:
    """C = A @ B by row blocks; A, B, C live whole on team rank 0 (``a_full``/``c_full`` None elsewhere).

    ``b`` is B itself on rank 0 and the receive buffer elsewhere.
    """
    root = 0  # team ranks are the first p global ranks: team rank 0 is global rank 0
    first = team.rank == 0
    dist.scatter(a_loc, list(a_full.chunk(team.p)) if first else None, src=root, group=team.group)
    dist.broadcast(b, src=root, group=team.group)
    with seg.compute():
        torch.matmul(a_loc, b, out=c_loc)
    dist.gather(c_loc, list(c_full.chunk(team.p)) if first else None, dst=root, group=team.group)


def summa(team: Team, plan, a_blk, b_blk, c_blk, a_pan, b_pan, seg: Segments,
          overlap: bool = False) -> None:
    """C_ij = sum over k panels of A_i,panel @ B_panel,j on a team.rows x team.cols grid.

    ``a_pan``/``b_pan``: two panel buffers each (mb x w, w x nb); the plain variant uses the first.
    """
    i, j = team.coords
    w = plan.w

    def fetch(panel: int, slot: int):
        works = []
        ja, off_a = plan.a_owner(panel)
        if team.cols > 1:
            a = a_pan[slot]
            if j == ja:
                a.copy_(a_blk[:, off_a:off_a + w])
            works.append(dist.broadcast(a, src=team.row_ranks[ja], group=team.row_group,
                                        async_op=overlap))
        else:  # a 1 x c grid row is one rank: the panel is a view of local data
            a = a_blk[:, off_a:off_a + w]
        ib, off_b = plan.b_owner(panel)
        if team.rows > 1:
            b = b_pan[slot]
            if i == ib:
                b.copy_(b_blk[off_b:off_b + w])
            works.append(dist.broadcast(b, src=team.col_ranks[ib], group=team.col_group,
                                        async_op=overlap))
        else:
            b = b_blk[off_b:off_b + w]
        return a, b, [wk for wk in works if wk is not None]

    pending = fetch(0, 0)
    for panel in range(plan.panels):
        a, b, works = pending
        for wk in works:
            wk.wait()  # on CUDA: the current stream waits for NCCL's stream, the host does not
        last = panel + 1 == plan.panels
        if overlap and not last:
            pending = fetch(panel + 1, (panel + 1) % 2)
        with seg.compute():
            if panel == 0:
                torch.matmul(a, b, out=c_blk)
            else:
                c_blk.addmm_(a, b)
        if not overlap and not last:
            pending = fetch(panel + 1, 0)
