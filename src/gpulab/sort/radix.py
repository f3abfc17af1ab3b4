"""Radix-partition sort (after RMG sort, BTW 2023): one all-to-all exchange, then local sorts.

Every key's destination device is decided from its most significant bits, so one exchange puts
each key on its final device and a local sort finishes the job (no merge stage).

Balance: the D-1 device boundaries are global ranks (the chunk offsets), and the key at each
boundary is found exactly by a distributed radix select: a histogram of the top 16 bits (summed
over devices), then, inside the bucket that holds the boundary rank, a histogram of the next 16
bits, and so on until all bits are fixed (2 rounds for 32-bit keys, 4 for 64-bit). Keys below a
boundary key go left of it, keys above go right; keys *equal* to a boundary key are split by
occurrence (device by device, in order), which is legal because equal keys are interchangeable.
So every device receives exactly its chunk size, whatever the distribution: skew (zipf, all-equal,
few-unique) costs no imbalance, only the equal-key splitting; the number of histogram passes is
recorded (at most 1 + (D-1) x (rounds-1)).
"""
from __future__ import annotations

import numpy as np

from gpulab.sort.chunks import assemble, host_to_host, offsets
from gpulab.sort.keys import key_bits, ordered_bits

DIGIT_BITS = 16


class RadixPartition:
    def __init__(self, backend, timer, digit_bits: int = DIGIT_BITS):
        self.b = backend
        self.timer = timer
        self.digit = digit_bits
        self.passes = 0
        self.keys_moved = 0
        self.tie_keys = 0  # keys equal to a boundary key (placed by occurrence)

    def sort(self, chunks: list) -> list:
        b, xp = self.b, self.b.xp
        sizes = [int(c.size) for c in chunks]
        off = offsets(sizes)
        if b.n > 1:
            with self.timer.phase("pivot_search"):
                u = b.run(lambda d: ordered_bits(xp, chunks[d]))
                split, below = self._select(u, off[1:-1], key_bits(chunks[0].dtype))
            with self.timer.phase("partition"):
                parts = self._partition(chunks, u, split, below, off)
            del u
            with self.timer.phase("exchange"):
                b.sync()
                recv = []
                for j in range(b.n):
                    pieces = [(d, parts[d][0], parts[d][1][j], parts[d][1][j + 1])
                              for d in range(b.n)]
                    arr, moved = assemble(b, j, pieces, chunks[j].dtype)
                    recv.append(arr)
                    self.keys_moved += moved
                b.sync()
            got = [int(r.size) for r in recv]
            if got != sizes:  # the balance guarantee, checked on every run
                raise RuntimeError(f"radix partition unbalanced: devices got {got}, want {sizes}")
            chunks = recv
        with self.timer.phase("local_sort"):
            return b.run(lambda d: b.sort(d, chunks[d]))

    def _hist(self, ud, consumed: int, prefix: int, bits: int, width: int) -> np.ndarray:
        xp, t = self.b.xp, ud.dtype.type
        sel = ud if consumed == 0 else ud[(ud >> t(width - consumed)) == t(prefix)]
        if sel.size == 0:
            return np.zeros(1 << bits, dtype=np.int64)
        digits = ((sel >> t(width - consumed - bits)) & t((1 << bits) - 1)).astype(np.int32)
        return self.b.asnumpy(xp.bincount(digits, minlength=1 << bits)).astype(np.int64)

    def _select(self, u: list, targets: list[int], width: int) -> tuple[list[int], list[int]]:
        """Exact keys (ordered bits) at the global ranks ``targets``, and the count below each."""
        state = [[0, 0, 0] for _ in targets]  # prefix, bits consumed, keys below the prefix range
        while True:
            todo = sorted({(c, p) for p, c, _ in state if c < width})
            if not todo:
                break
            hists = {}
            for c, p in todo:
                bits = min(self.digit, width - c)
                local = self.b.run(lambda d: self._hist(u[d], c, p, bits, width))
                hists[(c, p)] = np.sum(local, axis=0)
                self.passes += 1
            for s, t in zip(state, targets):
                p, c, below = s
                if c >= width:
                    continue
                bits = min(self.digit, width - c)
                h = hists[(c, p)]
                cum = np.cumsum(h)
                dg = int(np.searchsorted(cum, t - below, side="right"))
                s[:] = [(p << bits) | dg, c + bits, below + int(cum[dg] - h[dg])]
        return [s[0] for s in state], [s[2] for s in state]

    def _partition(self, chunks, u, split: list[int], below: list[int], off: list[int]) -> list:
        """Per device: keys grouped by destination, and the cut offsets of each destination."""
        b, xp, n = self.b, self.b.xp, self.b.n
        values = sorted(set(split))
        less = {v: below[split.index(v)] for v in values}  # global count of keys < v
        t = u[0].dtype.type
        eq = b.run(lambda d: [int(xp.count_nonzero(u[d] == t(v))) for v in values])
        self.tie_keys = sum(sum(e) for e in eq)
        base = [[less[v] + sum(eq[e][i] for e in range(d)) for i, v in enumerate(values)]
                for d in range(n)]
        split_np = np.array(split, dtype=u[0].dtype)
        starts_np = np.array(off[1:-1], dtype=np.int64)

        def part(d):
            ud = u[d]
            # Keys other than boundary keys: destination = number of boundary keys <= key.
            dest = xp.searchsorted(xp.asarray(split_np), ud, side="right")
            starts = xp.asarray(starts_np)
            for i, v in enumerate(values):
                idx = xp.nonzero(ud == t(v))[0]
                if idx.size:  # boundary keys: by global occurrence rank
                    pos = xp.arange(idx.size, dtype=np.int64) + base[d][i]
                    dest[idx] = xp.searchsorted(starts, pos, side="right")
            dest = dest.astype(np.uint8)
            counts = b.asnumpy(xp.bincount(dest, minlength=n))
            order = b.argsort_small(d, dest)
            return chunks[d][order], offsets(counts)

        return b.run(part)


def run(backend, host_in: np.ndarray, host_out: np.ndarray, timer,
        digit_bits: int = DIGIT_BITS, observer=None) -> dict:
    """Host to host: H2D, radix partition + all-to-all + local sort, D2H."""
    rp = RadixPartition(backend, timer, digit_bits)
    host_to_host(backend, host_in, host_out, timer, rp.sort)
    return {"keys_moved": rp.keys_moved, "histogram_passes": rp.passes, "tie_keys": rp.tie_keys}
