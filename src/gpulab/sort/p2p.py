"""P2P merge sort (Maltenberger et al., SIGMOD 2022): local sorts, then pivot / swap / merge.

Every device sorts its chunk. Two sorted sequences L and R (each on one or more devices) merge by
finding the leftmost pivot k (fewest keys moved), swapping the last k keys of L with the first k
keys of R device-to-device, and fixing up each side, which now holds two sorted runs. Chunk sizes
never change (a swap moves k keys each way), so the work stays load-balanced.

Merge schedule (any device count): the devices form a balanced binary tree (halves, the left one
smaller for odd counts); sibling groups merge bottom-up, all groups of one tree level together.
Fixing a group with two runs: a single device merges its runs locally; a larger group first fixes
the half that holds the run boundary (recursively), then merges its two sorted halves. For 2
devices this is one pivot/swap/merge; for 4 it is the paper's three stages (pairs 0-1 and 2-3,
the cross swap between the pairs, pairs again); 8 devices apply the 4-device scheme inside each
half after the cross swap.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from gpulab.sort.chunks import Group, assemble, host_to_host
from gpulab.sort.merge import leftmost_pivot, merge_sorted


@dataclass
class MergeStep:
    """One pivot search + swap between two device groups."""

    round: int
    left: str
    right: str
    len_left: int
    len_right: int
    pivot: int  # keys sent each way
    keys_moved: int  # keys that crossed the interconnect, both directions
    leftmost: bool  # pivot - 1 would not be a valid pivot
    valid: bool  # after the swap, max(left) <= min(right)

    def as_dict(self) -> dict:
        return asdict(self)


def _tree_levels(devices: tuple[int, ...]) -> list[list[tuple[tuple, tuple]]]:
    """Sibling pairs of the balanced device tree, grouped by height (leaves first)."""
    levels: dict[int, list] = {}

    def walk(devs):
        if len(devs) == 1:
            return 0
        h = len(devs) // 2
        height = 1 + max(walk(devs[:h]), walk(devs[h:]))
        levels.setdefault(height, []).append((devs[:h], devs[h:]))
        return height

    walk(devices)
    return [levels[h] for h in sorted(levels)]


class P2PMerge:
    """Sorts chunks that already sit on the devices; ``observer`` sees every pivot (tests)."""

    def __init__(self, backend, timer, observer: Callable | None = None):
        self.b = backend
        self.timer = timer
        self.observer = observer
        self.steps: list[MergeStep] = []
        self.chunks: list = []

    def sort(self, chunks: list) -> list:
        b = self.b
        with self.timer.phase("local_sort"):
            self.chunks = b.run(lambda d: b.sort(d, chunks[d]))
        for pairs in _tree_levels(tuple(range(b.n))):
            self._merge_pairs(pairs)
        return self.chunks

    @property
    def keys_moved(self) -> int:
        return sum(s.keys_moved for s in self.steps)

    def _at(self, group: Group):
        def get(pos):
            d, i = group.locate(pos)
            return self.b.item(d, self.chunks[d], i)
        return get

    def _merge_pairs(self, pairs) -> None:
        groups = [(Group.of(L, self.chunks), Group.of(R, self.chunks)) for L, R in pairs]
        with self.timer.phase("pivot_search"):
            ks = [leftmost_pivot(self._at(gl), gl.size, self._at(gr), gr.size) for gl, gr in groups]
            checks = [self._check_pivot(gl, gr, k) for (gl, gr), k in zip(groups, ks)]
        if self.observer is not None:
            for (gl, gr), k in zip(groups, ks):
                self.observer(self._host(gl), self._host(gr), k)
        rnd = len({s.round for s in self.steps})
        with self.timer.phase("exchange"):
            self.b.sync()  # the swap reads chunks other devices just wrote
            new, moved = {}, []
            for (gl, gr), k in zip(groups, ks):
                moved.append(self._swap(gl, gr, k, new) if k else 0)
            self.b.sync()
            for d, arr in new.items():
                self.chunks[d] = arr
        fix = []
        for (gl, gr), k, m, c in zip(groups, ks, moved, checks):
            self.steps.append(MergeStep(rnd, _name(gl), _name(gr), gl.size, gr.size, k, m, *c))
            if k:
                fix += [(gl, gl.size - k), (gr, k)]
        self._fix(fix)

    def _check_pivot(self, gl: Group, gr: Group, k: int) -> tuple[bool, bool]:
        """(leftmost, valid) of pivot k, from at most four keys (recorded with every step)."""
        L, R, a, b = self._at(gl), self._at(gr), gl.size, gr.size
        c1 = k == 0 or R(k - 1) <= L(a - k)
        c2 = k == a or k == b or L(a - k - 1) <= R(k)
        leftmost = k == 0 or L(a - k) > R(k - 1)
        return bool(leftmost), bool(c1 and c2)

    def _swap(self, gl: Group, gr: Group, k: int, new: dict) -> int:
        """Last k keys of gl <-> first k keys of gr, into fresh arrays (old ones are still read)."""
        a, dtype, chunks, moved = gl.size, self.chunks[gl.devices[0]].dtype, self.chunks, 0
        base = 0
        for d, size in zip(gl.devices, gl.sizes):
            keep = max(0, min(size, a - k - base))
            if keep < size:
                lo = max(base, a - k) - (a - k)
                pieces = [(d, chunks[d], 0, keep)] if keep else []
                pieces += [(s, chunks[s], i, j) for s, i, j in gr.slices(lo, base + size - (a - k))]
                new[d], m = assemble(self.b, d, pieces, dtype)
                moved += m
            base += size
        base = 0
        for d, size in zip(gr.devices, gr.sizes):
            recv = max(0, min(size, k - base))
            if recv:
                pieces = [(s, chunks[s], i, j) for s, i, j in gl.slices(a - k + base, a - k + base + recv)]
                if recv < size:
                    pieces.append((d, chunks[d], recv, size))
                new[d], m = assemble(self.b, d, pieces, dtype)
                moved += m
            base += size
        return moved

    def _fix(self, items: list[tuple[Group, int]]) -> None:
        """Make each group (two sorted runs split at the given position) one sorted sequence."""
        items = [(g, bnd) for g, bnd in items if 0 < bnd < g.size]
        singles = {g.devices[0]: bnd for g, bnd in items if len(g.devices) == 1}
        if singles:
            xp, chunks = self.b.xp, self.chunks
            with self.timer.phase("merge"):
                merged = self.b.run(
                    lambda d: merge_sorted(xp, chunks[d][:singles[d]], chunks[d][singles[d]:]),
                    list(singles))
            for d, arr in zip(singles, merged):
                self.chunks[d] = arr
        sub, pairs = [], []
        for g, bnd in items:
            if len(g.devices) == 1:
                continue
            h1, h2 = g.split()
            if bnd < h1.size:
                sub.append((h1, bnd))
            elif bnd > h1.size:
                sub.append((h2, bnd - h1.size))
            pairs.append((h1.devices, h2.devices))
        if sub:
            self._fix(sub)
        if pairs:
            self._merge_pairs(pairs)

    def _host(self, g: Group) -> np.ndarray:
        parts = []
        for d in g.devices:
            c = self.chunks[d]
            parts.append(c if self.b.xp is np else self.b.xp.asnumpy(c))
        return np.concatenate(parts)


def _name(g: Group) -> str:
    return "+".join(str(d) for d in g.devices)


def run(backend, host_in: np.ndarray, host_out: np.ndarray, timer, observer=None) -> dict:
    """Host to host: H2D, P2P merge sort, D2H. Returns keys moved and the merge steps."""
    p2p = P2PMerge(backend, timer, observer)
    host_to_host(backend, host_in, host_out, timer, p2p.sort)
    return {"keys_moved": p2p.keys_moved, "steps": [s.as_dict() for s in p2p.steps]}
