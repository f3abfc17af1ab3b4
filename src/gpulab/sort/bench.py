"""The sort stage: single-device baselines and P2P / HET / radix-partition sort on 1..N devices.

Every configuration is timed (warm-up, repetitions, median with min/max) and its output verified
(sorted, same multiset as the input, equal to numpy's sort up to ``verify_numpy_max_keys``).
"""
from __future__ import annotations

import contextlib
import logging
import time
import traceback
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpulab import timing
from gpulab.sort import het, p2p, radix
from gpulab.sort.backend import make_backend
from gpulab.sort.keys import Reference, fingerprint, make_keys, reference, verify

log = logging.getLogger("gpulab.sort")

ALGORITHMS = {"p2p": p2p.run, "het": het.run, "radix": radix.run}
BASELINES = ("numpy", "torch", "cupy")
PHASES = ("h2d", "local_sort", "pivot_search", "partition", "exchange", "merge", "d2h")
KEYS = ["sweep", "algorithm", "scope", "key_type", "distribution", "n_keys", "devices"]


class NullTimer:
    """Phase timer that records nothing (device-resident bar runs are timed as a whole)."""

    phases: dict = {}

    def phase(self, name):
        return contextlib.nullcontext()


@dataclass(frozen=True)
class Case:
    sweep: str  # "size": the size sweep; "matrix": key type x distribution
    key_type: str
    distribution: str
    n_keys: int


def cases(cfg: dict) -> list[Case]:
    out, seen = [], set()
    kt0 = cfg["key_types"][0]
    wanted = [Case("size", kt0, "uniform", n) for n in cfg["sweep_sizes"]]
    wanted += [Case("matrix", kt, dist, cfg["matrix_size"])
               for kt in cfg["key_types"] for dist in cfg["distributions"]]
    for c in wanted:
        key = (c.key_type, c.distribution, c.n_keys)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


class Bench:
    def __init__(self, cfg: dict, kind: str, available: int, device_name: str):
        self.cfg = cfg
        self.kind = kind
        self.available = available
        self.device_name = device_name
        self.warmup, self.repeats = int(cfg["warmup"]), int(cfg["repeats"])
        self.counts = [d for d in cfg["device_counts"] if d <= available]
        self.rows, self.phase_rows, self.steps, self.balance = [], [], [], []
        self.skipped, self.failures = [], []
        self.logic_steps: list[dict] = []  # P2P merge steps of the logic check
        self.backends = {d: make_backend(kind, d) for d in self.counts}
        # Baselines, the bar and host staging buffers use device 0 alone.
        self.single = self.backends.get(1) or make_backend(kind, 1)
        for d in cfg["device_counts"]:
            if d > available:
                self._skip(f"{d} devices", f"not applicable: {available} {kind} device(s) here")

    def close(self):
        for b in {*self.backends.values(), self.single}:
            b.close()

    def free(self):
        """Return cached device and pinned memory between cases (torch's cache too)."""
        for b in {*self.backends.values(), self.single}:
            b.free()
        if self.kind == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _skip(self, what: str, why: str):
        if not any(s["what"] == what and s["reason"] == why for s in self.skipped):
            self.skipped.append({"what": what, "reason": why})

    def _fail(self, what: str, exc: BaseException):
        log.error("sort: %s failed: %s", what, exc)
        self.failures.append({"what": what, "error": f"{type(exc).__name__}: {exc}",
                              "traceback": traceback.format_exc()[-2000:]})

    # -- one case ----------------------------------------------------------------------------
    def run_case(self, case: Case, seed: int) -> None:
        keys = make_keys(case.distribution, case.key_type, case.n_keys, seed)
        ref = reference(keys, int(self.cfg["verify_numpy_max_keys"]))
        base = {"sweep": case.sweep, "key_type": case.key_type,
                "distribution": case.distribution, "n_keys": case.n_keys}
        for name in self.cfg["baselines"]:
            label = f"{name}.sort {case.key_type}/{case.distribution}/{case.n_keys}"
            try:
                self._baseline(name, keys, ref, base)
            except Exception as exc:  # noqa: BLE001 - recorded, the stage goes on
                self._fail(label, exc)
        host_in = self.single.pinned_copy(keys)
        for alg in self.cfg["algorithms"]:
            for d in self.counts:
                label = f"{alg} on {d} device(s) {case.key_type}/{case.distribution}/{case.n_keys}"
                if case.n_keys < d:
                    self._skip(label, "fewer keys than devices")
                    continue
                try:
                    self._algorithm(alg, self.backends[d], host_in, ref, base)
                except Exception as exc:  # noqa: BLE001
                    self._fail(label, exc)
        del host_in
        self.free()

    def _row(self, base, algorithm, scope, devices, stats, check, **extra) -> dict:
        n = base["n_keys"]
        row = {**base, "algorithm": algorithm, "scope": scope, "devices": devices,
               **stats.as_dict("time_s"), "keys_per_s": n / stats.median,
               "keys_moved": 0, "bytes_moved": 0, **check}
        row.update(extra)
        self.rows.append(row)
        return row

    def _baseline(self, name: str, keys: np.ndarray, ref: Reference, base: dict) -> None:
        n = keys.size
        if name == "numpy":
            if n > int(self.cfg["numpy_max_keys"]):
                self._skip(f"numpy.sort, {n} keys", "above numpy_max_keys (slow on the host)")
                return
            out = {}
            stats = timing.measure(lambda: out.__setitem__("v", np.sort(keys)),
                                   warmup=self.warmup, repeats=self.repeats)
            self._row(base, "numpy.sort", "host", 1, stats, verify(np, out["v"], ref))
        elif name == "torch":
            self._torch(keys, ref, base)
        elif name == "cupy":
            if self.kind != "cuda":
                self._skip("cupy.sort", "not applicable: needs a CUDA GPU and CuPy")
                return
            cp = self.single.cp
            xd = self.single.to_device(0, keys)
            out = {}
            stats = self.single.time_device(
                lambda: out.__setitem__("v", cp.sort(xd)), 0, self.warmup, self.repeats)
            self._row(base, "cupy.sort", "device", 1, stats, verify(cp, out["v"], ref))

    def _torch(self, keys: np.ndarray, ref: Reference, base: dict) -> None:
        import torch

        dev = torch.device("cuda", 0) if self.kind == "cuda" else torch.device("cpu")
        t = torch.from_numpy(keys).to(dev)
        out = {}
        try:
            stats = timing.measure(lambda: out.__setitem__("v", torch.sort(t)),
                                   warmup=self.warmup, repeats=self.repeats,
                                   device=dev if dev.type == "cuda" else None)
        except (NotImplementedError, RuntimeError) as exc:  # e.g. no sort kernel for uint32
            if not isinstance(exc, NotImplementedError) and "not implemented" not in str(exc):
                raise
            self._skip(f"torch.sort {keys.dtype} on {dev.type}",
                       f"not applicable: {str(exc).splitlines()[0]}")
            return
        values, idx = out["v"]
        check = verify(np, values.cpu().numpy(), ref)
        # torch also returns the permutation: it must reproduce the values.
        check["verified"] = check["verified"] and bool(torch.equal(t[idx], values))
        check["checks"] += "+indices"
        self._row(base, "torch.sort", "device", 1, stats, check,
                  note="values and int64 indices")

    def _algorithm(self, alg: str, backend, host_in: np.ndarray, ref: Reference, base: dict):
        fn = ALGORITHMS[alg]
        n, itemsize = host_in.size, host_in.dtype.itemsize
        out = backend.host_empty(n, host_in.dtype)
        totals, phases, info = [], [], {}
        for rep in range(self.warmup + self.repeats):
            out.fill(0)  # a stale result must not pass verification
            sw = timing.Stopwatch(sync=backend.sync)
            backend.sync()
            t0 = time.perf_counter()
            info = fn(backend, host_in, out, sw)
            backend.sync()
            if rep >= self.warmup:
                totals.append(time.perf_counter() - t0)
                phases.append(sw.phases)
        stats = timing.summarize(totals)
        check = verify(np, out, ref)
        moved = int(info.get("keys_moved", 0))
        self._row(base, alg, "host-to-host", backend.n, stats, check, keys_moved=moved,
                  bytes_moved=moved * itemsize, bytes_h2d=n * itemsize, bytes_d2h=n * itemsize)
        for ph in PHASES:
            samples = [p.get(ph, 0.0) for p in phases]
            if any(samples):
                s = timing.summarize(samples)
                self.phase_rows.append({**base, "algorithm": alg, "scope": "host-to-host",
                                        "devices": backend.n, "phase": ph, **s.as_dict("time_s"),
                                        "share": s.median / stats.median})
        ident = {**base, "devices": backend.n}
        if alg == "p2p":
            self.steps += [{**ident, **s} for s in info["steps"]]
        if alg == "radix":
            self.balance.append({**ident, "histogram_passes": info["histogram_passes"],
                                 "tie_keys": info["tie_keys"], "keys_moved": moved,
                                 "moved_fraction": moved / n})

    # -- correctness on more devices than the host has -----------------------------------------
    def logic_check(self, seed: int) -> list[dict]:
        """Run the algorithms on 2-4 logical devices where the host has fewer real ones.

        On CUDA the logical devices share the GPUs round-robin (CuPy arrays, the same copy and merge
        code as on separate GPUs), on CPU they are more virtual devices. Correctness only: nothing
        here is timed, and no keys cross an interconnect.
        """
        counts = [d for d in (2, 3, 4) if d > self.available]
        n = min(int(self.cfg["matrix_size"]), 1000003)
        cases = [("uint32", "uniform"), ("uint32", "all_equal"), ("uint32", "reverse"),
                 ("float32", "normal"), ("uint64", "few_unique")]
        rows = []
        for d in counts:
            b = make_backend(self.kind, d, [i % self.available for i in range(d)])
            try:
                for i, (kt, dist) in enumerate(cases):
                    keys = make_keys(dist, kt, n, seed + i)
                    ref = reference(keys, int(self.cfg["verify_numpy_max_keys"]))
                    host_in = b.pinned_copy(keys)
                    for alg in self.cfg["algorithms"]:
                        out = b.host_empty(n, keys.dtype)
                        label = f"logic check {alg} on {d} logical devices {kt}/{dist}/{n}"
                        try:
                            info = ALGORITHMS[alg](b, host_in, out, NullTimer())
                        except Exception as exc:  # noqa: BLE001
                            self._fail(label, exc)
                            continue
                        steps = info.get("steps", [])
                        self.logic_steps += steps
                        pivots_ok = all(s["leftmost"] and s["valid"] for s in steps)
                        rows.append({"algorithm": alg, "logical_devices": d,
                                     "physical_devices": min(d, self.available), "key_type": kt,
                                     "distribution": dist, "n_keys": n,
                                     "keys_moved": int(info.get("keys_moved", 0)),
                                     "pivots_leftmost": pivots_ok,
                                     **verify(np, out, ref)})
            finally:
                b.free()
                b.close()
        return rows

    # -- the bars ----------------------------------------------------------------------------
    def single_device_bar(self, seed: int) -> dict:
        n = int(self.cfg["bar_keys"])
        name = f"single-device sort of {n} uint32 keys >= 95% of cupy.sort"
        if self.kind != "cuda":
            return bar_na(name, "keys/s", "not applicable: needs a CUDA GPU and CuPy")
        b = self.single
        cp = b.cp
        xd = b.to_device(0, make_keys("uniform", "uint32", n, seed))
        with b.on(0):
            ref = Reference(fingerprint(cp, xd), None)
        res = {}
        path = p2p.P2PMerge(b, NullTimer())
        ours, cupy_ = [], []
        for _ in range(2):  # interleaved, so clock or thermal drift hits both sides alike
            cupy_ += b.time_device(lambda: res.__setitem__("c", cp.sort(xd)), 0, self.warmup,
                                   self.repeats).samples
            ours += b.time_device(lambda: res.__setitem__("o", path.sort([xd])[0]), 0,
                                  self.warmup, self.repeats).samples
        so, sc = timing.summarize(ours), timing.summarize(cupy_)
        base = {"sweep": "bar", "key_type": "uint32", "distribution": "uniform", "n_keys": n}
        with b.on(0):
            co = verify(cp, res["o"], ref)
            cc = verify(cp, res["c"], ref)
        self._row(base, "p2p", "device", 1, so, co, note="gpulab single-device path")
        self._row(base, "cupy.sort", "device", 1, sc, cc, note="bar reference")
        del xd, res
        self.free()
        ratio = sc.median / so.median
        ok = co["verified"] and cc["verified"]
        return {"bar": name, "measured": n / so.median, "reference": n / sc.median,
                "ratio": ratio, "threshold": 0.95, "passed": bool(ok and ratio >= 0.95),
                "unit": "keys/s", "note": f"median of {so.n} runs each, interleaved; device-resident "
                                          f"keys; outputs verified: {ok}"}

    def pivot_bar(self) -> dict:
        name = "P2P sort moves exactly the keys implied by the leftmost pivots"
        steps = pd.DataFrame(self.steps or self.logic_steps)
        where = "timed runs" if self.steps else "logical devices of the logic check"
        if steps.empty:
            return bar_na(name, "keys", "not applicable: P2P merges need >= 2 devices "
                                        f"({self.available} here)")
        moved, implied = int(steps["keys_moved"].sum()), int(2 * steps["pivot"].sum())
        ok = moved == implied and bool(steps["leftmost"].all()) and bool(steps["valid"].all())
        return {"bar": name, "measured": float(moved), "reference": float(implied),
                "ratio": moved / implied if implied else 1.0, "threshold": 1.0, "passed": ok,
                "unit": "keys", "note": f"{len(steps)} merge steps ({where}); every pivot checked "
                                        "leftmost (one key less would be invalid) and valid"}


def bar_na(name: str, unit: str, why: str) -> dict:
    nan = float("nan")
    return {"bar": name, "measured": nan, "reference": nan, "ratio": nan, "threshold": nan,
            "passed": "n/a", "unit": unit, "note": why}
