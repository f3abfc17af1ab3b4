"""Key types, input distributions and the output checks (sorted, same multiset, equal to numpy).

The multiset check is an order-independent fingerprint: the count of keys and the wrapping 64-bit
sum of a strong mix (splitmix64's finalizer) of every key's bit pattern. A permutation keeps it
exactly; a lost, duplicated or altered key changes it except with probability about 2^-64. It runs
with numpy or cupy (``xp``), in blocks so it needs little extra memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KEY_TYPES = {"uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64),
             "float32": np.dtype(np.float32)}
DISTRIBUTIONS = ("uniform", "normal", "zipf", "sorted", "reverse", "all_equal", "few_unique")
FEW_UNIQUE = 16  # distinct values in the few_unique distribution
ZIPF_A = 1.5     # zipf exponent: about 38% of the keys are the smallest value

_BITS = {4: np.uint32, 8: np.uint64}
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def key_dtype(name: str) -> np.dtype:
    try:
        return KEY_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown key type {name!r}; expected one of {sorted(KEY_TYPES)}") from None


def _uniform(rng: np.random.Generator, dtype: np.dtype, n: int) -> np.ndarray:
    if dtype.kind == "f":  # both signs, so the float-to-ordered-bits mapping is exercised
        return rng.uniform(-1.0, 1.0, n).astype(dtype)
    return rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)


def _from_float(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        return x.astype(dtype)
    hi = float(np.iinfo(dtype).max)
    # float64 -> uint64 is exact only below 2^64; clip a little below it.
    return np.clip(x, 0, np.nextafter(hi, 0)).astype(dtype)


def make_keys(dist: str, key_type: str, n: int, seed: int) -> np.ndarray:
    """``n`` random keys of ``key_type`` drawn from ``dist`` (never all zeros)."""
    dtype = key_dtype(key_type)
    if n < 1:
        raise ValueError(f"number of keys must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return _uniform(rng, dtype, n)
    if dist == "normal":
        if dtype.kind == "f":
            return rng.standard_normal(n, dtype=np.float32)
        bits = dtype.itemsize * 8
        return _from_float(rng.normal(2.0 ** (bits - 1), 2.0 ** (bits - 4), n), dtype)
    if dist == "zipf":
        return _from_float(rng.zipf(ZIPF_A, n).astype(np.float64), dtype)
    if dist == "sorted":
        return np.sort(_uniform(rng, dtype, n))
    if dist == "reverse":
        return np.sort(_uniform(rng, dtype, n))[::-1].copy()
    if dist == "all_equal":
        v = _uniform(rng, dtype, 2)
        return np.full(n, v[0] if v[0] != 0 else v[1], dtype=dtype)
    if dist == "few_unique":
        values = _uniform(rng, dtype, FEW_UNIQUE)
        return values[rng.integers(0, FEW_UNIQUE, n)]
    raise ValueError(f"unknown distribution {dist!r}; expected one of {list(DISTRIBUTIONS)}")


def ordered_bits(xp, a):
    """Unsigned integers with the same order as the keys (floats: flip sign bit / all bits)."""
    if a.dtype.kind == "u":
        return a
    if a.dtype == np.float32:
        u = a.view(np.uint32)
        return xp.where(u >> np.uint32(31) != 0, ~u, u | np.uint32(0x80000000))
    raise TypeError(f"no ordered-bits mapping for key dtype {a.dtype}")


def key_bits(dtype) -> int:
    return np.dtype(dtype).itemsize * 8


def fingerprint(xp, a, block: int = 1 << 24) -> tuple[int, int]:
    """(count, wrapping uint64 sum of splitmix64(bits)) of a 1-D key array."""
    bits = a.view(_BITS[a.dtype.itemsize])
    total = 0
    for s in range(0, a.size, block):
        x = bits[s:s + block].astype(np.uint64)
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
        total = (total + int(xp.sum(x, dtype=np.uint64))) % (1 << 64)
    return int(a.size), total


def is_sorted(xp, a) -> bool:
    return a.size < 2 or bool(xp.all(a[1:] >= a[:-1]))


@dataclass
class Reference:
    """What an output is checked against: the input's fingerprint, and numpy's sort if small."""

    fingerprint: tuple[int, int]
    numpy_sorted: np.ndarray | None


def reference(keys: np.ndarray, numpy_max_keys: int) -> Reference:
    return Reference(fingerprint(np, keys), np.sort(keys) if keys.size <= numpy_max_keys else None)


def verify(xp, out, ref: Reference) -> dict:
    """Check one sorted output (numpy or cupy array); a dict of named checks and 'ok'."""
    sorted_ok = is_sorted(xp, out)
    multiset_ok = fingerprint(xp, out) == ref.fingerprint
    if ref.numpy_sorted is not None:
        host = out if xp is np else xp.asnumpy(out)
        numpy_ok = bool(np.array_equal(host, ref.numpy_sorted))
    else:
        numpy_ok = None
    checks = ["sorted", "multiset"] + (["numpy"] if numpy_ok is not None else [])
    ok = sorted_ok and multiset_ok and numpy_ok is not False
    return {"sorted": sorted_ok, "multiset": multiset_ok, "equals_numpy": numpy_ok,
            "verified": ok, "checks": "+".join(checks)}
