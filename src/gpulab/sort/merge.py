"""Merging building blocks: the two-way merge, the leftmost pivot search, the CPU multiway merge.

Two-way merge by co-ranking: the output position of ``a[i]`` is ``i`` plus the number of keys of
``b`` strictly below it, that of ``b[j]`` is ``j`` plus the number of keys of ``a`` not above it
(``a`` wins ties, so the merge is stable). Both ranks are one vectorised ``searchsorted``, so the
same code merges numpy arrays on the CPU and CuPy arrays on a GPU (every output slot is written
exactly once: the two rank sets partition 0..n-1).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np


def merge_sorted(xp, a, b, out=None):
    """Merge two sorted 1-D arrays of one dtype into ``out`` (allocated when None)."""
    n = a.size + b.size
    if out is None:
        out = xp.empty(n, dtype=a.dtype)
    elif out.size != n:
        raise ValueError(f"merge output has {out.size} slots for {n} keys")
    if a.size == 0 or b.size == 0:
        out[...] = a if b.size == 0 else b
        return out
    ia = xp.arange(a.size, dtype=np.int64)
    ia += xp.searchsorted(b, a, side="left")
    out[ia] = a
    del ia
    ib = xp.arange(b.size, dtype=np.int64)
    ib += xp.searchsorted(a, b, side="right")
    out[ib] = b
    return out


def leftmost_pivot(left_at: Callable[[int], object], len_left: int,
                   right_at: Callable[[int], object], len_right: int) -> int:
    """Fewest keys to swap between two sorted sequences L and R so that max(L') <= min(R').

    Swapping the last k keys of L with the first k keys of R works exactly when
    (1) R[k-1] <= L[a-k] and (2) L[a-k-1] <= R[k] (a = |L|; bounds that fall outside are true).
    (2) is false for small k and true from some k on, and at its first true k (1) holds too (it is
    the negation of (2) at k-1), so a binary search on (2) finds the leftmost valid pivot: the
    fewest keys moved. It reads only O(log min(a, b)) single keys (``left_at``/``right_at``), so
    L and R may each span several devices.
    """
    a = len_left
    lo, hi = 0, min(len_left, len_right)
    while lo < hi:
        k = (lo + hi) // 2
        if left_at(a - k - 1) <= right_at(k):
            hi = k
        else:
            lo = k + 1
    return lo


def leftmost_pivot_bruteforce(left: np.ndarray, right: np.ndarray) -> int:
    """The same pivot by trying every k from 0 upwards (tests only)."""
    a = left.size
    for k in range(min(a, right.size) + 1):
        low = np.concatenate([left[:a - k], right[:k]])
        high = np.concatenate([left[a - k:], right[k:]])
        if low.size == 0 or high.size == 0 or low.max() <= high.min():
            return k
    raise AssertionError("no valid pivot: inputs are not sorted")


def _tree_merge(pieces: list[np.ndarray], out: np.ndarray) -> None:
    """Merge sorted pieces pairwise (a balanced tree), the last merge written into ``out``."""
    pieces = [p for p in pieces if p.size]
    if not pieces:
        return
    while len(pieces) > 2:
        nxt = [merge_sorted(np, pieces[i], pieces[i + 1]) for i in range(0, len(pieces) - 1, 2)]
        if len(pieces) % 2:
            nxt.append(pieces[-1])
        pieces = nxt
    if len(pieces) == 1:
        np.copyto(out, pieces[0])
    else:
        merge_sorted(np, pieces[0], pieces[1], out=out)


def multiway_merge(runs: Sequence[np.ndarray], out: np.ndarray, threads: int = 1) -> int:
    """Merge sorted host arrays into ``out`` on ``threads`` CPU threads; returns the parts used.

    The key range is cut by splitter values (evenly spaced keys of the longest run); every run is
    cut at the same splitters with ``searchsorted``, so part p of every run holds the same key
    range and the parts are merged independently into consecutive slices of ``out``. Skewed keys
    (many equal to a splitter) only make the parts uneven, never wrong.
    """
    n = sum(r.size for r in runs)
    if out.size != n:
        raise ValueError(f"multiway merge output has {out.size} slots for {n} keys")
    parts = max(1, min(threads, n // (1 << 16) or 1))
    longest = max(runs, key=lambda r: r.size)
    if parts > 1 and longest.size:
        idx = (np.arange(1, parts) * longest.size) // parts
        splitters = np.unique(longest[idx])
    else:
        splitters = longest[:0]
    cuts = [np.concatenate([[0], np.searchsorted(r, splitters, side="left"), [r.size]])
            for r in runs]
    jobs, offset = [], 0
    for p in range(splitters.size + 1):
        pieces = [r[c[p]:c[p + 1]] for r, c in zip(runs, cuts)]
        size = sum(x.size for x in pieces)
        jobs.append((pieces, out[offset:offset + size]))
        offset += size
    if len(jobs) == 1:
        _tree_merge(*jobs[0])
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(jobs))) as pool:
            list(pool.map(lambda j: _tree_merge(*j), jobs))
    return len(jobs)
