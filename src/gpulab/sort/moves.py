"""Keys moved by the P2P merge sort, counted from the keys themselves rather than from the pivots.

The pivots say how many keys a merge step swaps (2k for a pivot k); that figure is what the sort's
own ``keys_moved`` reports, so it cannot check itself. Here every key carries a tag, its origin
device: the keys are a random permutation of 0..n-1, so a key's value names it, and ``origin[v]``
is the device whose input chunk held v. Two counts come from the keys, not from the pivots:

- *counted*: keys that, after the sort, sit on a device other than their origin;
- *needed*: keys whose place in the sorted output (value v goes to position v) is on a device other
  than their origin: the fewest keys any correct sort with these chunk sizes must move.

A correct output has counted == needed. Only device-to-device swaps move keys between devices, so
on two devices (one merge step) the pivots must claim exactly the needed keys (the leftmost pivot
is the minimal exchange); on more devices a key may cross more than once (the tree schedule), and
the pivots claim at least the needed keys.
"""
from __future__ import annotations

import numpy as np

from gpulab.outcomes import Check
from gpulab.sort.chunks import scatter_to_devices

CHECK = "P2P keys moved: counted from origin tags vs the pivots' claim"


def tagged_keys(n: int, seed: int) -> np.ndarray:
    """n distinct uint32 keys in random order (a key's value is its tag's index)."""
    return np.random.default_rng(seed).permutation(n).astype(np.uint32)


def origins(keys: np.ndarray, sizes: list[int]) -> np.ndarray:
    """origin[v] = the device whose input chunk holds key v."""
    out = np.empty(keys.size, dtype=np.int64)
    out[keys] = np.repeat(np.arange(len(sizes)), sizes)
    return out


def ended_elsewhere(origin: np.ndarray, final_chunks: list[np.ndarray]) -> int:
    """Keys sitting on a device other than their origin (final chunks on the host, in device order)."""
    return int(sum(np.count_nonzero(origin[np.asarray(c, dtype=np.int64)] != d)
                   for d, c in enumerate(final_chunks)))


def needed_moves(origin: np.ndarray, sizes: list[int]) -> int:
    """Keys whose sorted position (v for key v) lies on a device other than their origin."""
    dest = np.repeat(np.arange(len(sizes)), sizes)  # device of each output position
    return int(np.count_nonzero(dest != origin))


def judge(case: str, devices: int, counted: int, needed: int, claimed: int) -> Check:
    """Pass when the keys ended where sorted keys must (counted == needed) and the pivots claim
    exactly the needed moves on two devices, at least them on more."""
    placed = counted == needed
    if devices == 2:
        ok, rule = placed and claimed == needed, "one merge step: pivots' claim = needed"
    else:
        ok, rule = placed and claimed >= needed, ("several merge steps (a key may cross more than "
                                                  "once): pivots' claim >= needed")
    return Check.of(CHECK, case, ok, value=claimed, bound=needed,
                    note=f"value: 2 x sum of the pivots; bound: keys whose sorted place is on "
                         f"another device than their origin tag ({needed}); keys found on "
                         f"another device after the sort: {counted}; {rule}")


def count_run(backend, n: int, seed: int, sort_factory) -> tuple[int, int, int]:
    """Sort tagged keys on the backend's devices: (counted, needed, claimed).

    ``sort_factory(backend)`` returns an object with ``sort(chunks) -> chunks`` and ``steps``
    (a :class:`gpulab.sort.p2p.P2PMerge`).
    """
    keys = tagged_keys(n, seed)
    chunks = scatter_to_devices(backend, backend.pinned_copy(keys))
    sizes = [int(c.size) for c in chunks]
    origin = origins(keys, sizes)
    merger = sort_factory(backend)
    final = merger.sort(chunks)
    backend.sync()
    host = [backend.asnumpy(c) for c in final]
    claimed = int(sum(2 * s.pivot for s in merger.steps))
    return ended_elsewhere(origin, host), needed_moves(origin, sizes), claimed
