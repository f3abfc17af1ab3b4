"""Peak memory of one call: how much the process's resident set grew at its highest point.

On Linux the kernel's resident high-water mark (VmHWM) can be reset to the current RSS by writing
5 to /proc/self/clear_refs, so peak - baseline is what the call itself needed at its worst,
including memory that C libraries (pandas' parser, HDF5, zlib) allocate outside Python. Freed
memory is handed back to the OS first (malloc_trim) so that earlier calls' leftovers are not
silently reused. Elsewhere, tracemalloc's peak (Python and numpy allocations only) is used.
"""
from __future__ import annotations

import ctypes
import functools
import tracemalloc
from pathlib import Path
from typing import Callable

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _trim() -> None:
    # No gc.collect(): arrays are freed by reference counting, and a full collection with torch
    # loaded costs ~0.5 s.
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _reset_hwm() -> bool:
    try:
        _CLEAR.write_text("5")  # Linux >= 4.0; the write fails where unsupported
        return True
    except OSError:
        return False


def peak_increase(fn: Callable[[], object]) -> tuple[int, str, object]:
    """(peak bytes above the starting point while ``fn()`` ran, method used, what ``fn`` returned).

    The result is handed back rather than dropped so that a caller can check it: one call both
    measures and yields the data to verify, instead of a second full run for the check."""
    _trim()
    if _reset_hwm():
        base = _status_kib("VmRSS")
        out = fn()
        peak = _status_kib("VmHWM")
        return max(0, peak - base) * 1024, "rss-hwm", out
    tracemalloc.start()
    try:
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
        return int(peak), "tracemalloc", out
    finally:
        tracemalloc.stop()
