"""Keys spread over devices: equal chunks, H2D/D2H, and views of device groups as one sequence."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def chunk_sizes(n: int, devices: int) -> list[int]:
    """Load-balanced chunk sizes (they differ by at most one key)."""
    if devices < 1:
        raise ValueError(f"need at least one device, got {devices}")
    q, r = divmod(n, devices)
    return [q + (1 if i < r else 0) for i in range(devices)]


def offsets(sizes) -> list[int]:
    return [int(x) for x in np.concatenate([[0], np.cumsum(sizes)])]


def scatter_to_devices(backend, host: np.ndarray) -> list:
    """H2D: chunk d of ``host`` onto device d, all devices at once."""
    off = offsets(chunk_sizes(host.size, backend.n))
    views = [host[off[d]:off[d + 1]] for d in range(backend.n)]
    return backend.run(lambda d: backend.to_device(d, views[d]))


def gather_to_host(backend, chunks: list, out: np.ndarray) -> None:
    """D2H: every device's chunk into its slice of ``out``, all devices at once."""
    off = offsets([c.size for c in chunks])
    views = [out[off[d]:off[d + 1]] for d in range(len(chunks))]
    backend.run(lambda d: backend.to_host(d, chunks[d], views[d]))


@dataclass
class Group:
    """Devices whose chunks, concatenated in order, form one sorted sequence (or two runs)."""

    devices: tuple[int, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, devices, chunks) -> "Group":
        devices = tuple(devices)
        return cls(devices, tuple(int(chunks[d].size) for d in devices))

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def locate(self, pos: int) -> tuple[int, int]:
        """(device, index in its chunk) of position ``pos`` of the group's sequence."""
        for d, s in zip(self.devices, self.sizes):
            if pos < s:
                return d, pos
            pos -= s
        raise IndexError(pos)

    def slices(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """[(device, local start, local stop)] covering positions [start, stop) of the group."""
        out, base = [], 0
        for d, s in zip(self.devices, self.sizes):
            lo, hi = max(start, base), min(stop, base + s)
            if lo < hi:
                out.append((d, lo - base, hi - base))
            base += s
        return out

    def split(self) -> tuple["Group", "Group"]:
        h = len(self.devices) // 2
        return (Group(self.devices[:h], self.sizes[:h]), Group(self.devices[h:], self.sizes[h:]))


def assemble(backend, d: int, pieces: list[tuple[int, object, int, int]], dtype):
    """A new array on device d made of pieces (src device, array, start, stop), copied in order.

    Returns (array, keys that came from other devices, i.e. crossed the interconnect).
    """
    total = sum(stop - start for _, _, start, stop in pieces)
    out = backend.empty(d, total, dtype)
    off = moved = 0
    for src, arr, start, stop in pieces:
        backend.copy_into(d, out, off, src, arr, start, stop)
        off += stop - start
        if src != d:
            moved += stop - start
    return out, moved


def host_to_host(backend, host_in: np.ndarray, host_out: np.ndarray, timer, sort_chunks) -> None:
    """H2D, ``sort_chunks(chunks) -> chunks`` on the devices, D2H: one timed host-to-host sort."""
    with timer.phase("h2d"):
        chunks = scatter_to_devices(backend, host_in)
    chunks = sort_chunks(chunks)
    with timer.phase("d2h"):
        gather_to_host(backend, chunks, host_out)
