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
from gpulab.outcomes import Bar, Check
from gpulab.sort import het, moves, p2p, radix
from gpulab.sort.backend import make_backend
from gpulab.sort.keys import Reference, fingerprint, make_keys, reference, verify
from gpulab.sort.settings import Settings

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


def cases(cfg: Settings) -> list[Case]:
    out, seen = [], set()
    kt0 = cfg.key_types[0]
    wanted = [Case("size", kt0, "uniform", n) for n in cfg.sweep_sizes]
    wanted += [Case("matrix", kt, dist, cfg.matrix_size)
               for kt in cfg.key_types for dist in cfg.distributions]
    for c in wanted:
        key = (c.key_type, c.distribution, c.n_keys)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


class Bench:
    def __init__(self, cfg: Settings, kind: str, available: int, device_name: str):
        self.cfg = cfg
        self.kind = kind
        self.available = available
        self.device_name = device_name
        self.warmup, self.repeats = cfg.warmup, cfg.repeats
        self.counts = [d for d in cfg.device_counts if d <= available]
        self.rows, self.phase_rows, self.steps, self.balance = [], [], [], []
        self.skipped, self.failures = [], []
        self.logic_steps: list[dict] = []  # P2P merge steps of the logic check
        self.backends = {d: make_backend(kind, d) for d in self.counts}
        # Baselines, the bar and host staging buffers use device 0 alone.
        self.single = self.backends.get(1) or make_backend(kind, 1)
        for d in cfg.device_counts:
            if d > available:
                self._skip(f"{d} devices", f"{available} {kind} device(s) here")

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
        ref = reference(keys, self.cfg.verify_numpy_max_keys)
        base = {"sweep": case.sweep, "key_type": case.key_type,
                "distribution": case.distribution, "n_keys": case.n_keys}
        for name in self.cfg.baselines:
            label = f"{name}.sort {case.key_type}/{case.distribution}/{case.n_keys}"
            try:
                self._baseline(name, keys, ref, base)
            except Exception as exc:  # noqa: BLE001 - recorded, the stage goes on
                self._fail(label, exc)
        host_in = self.single.pinned_copy(keys)
        for alg in self.cfg.algorithms:
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
            if n > self.cfg.numpy_max_keys:
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
                self._skip("cupy.sort", "needs a CUDA GPU and CuPy")
                return
            cp = self.single.cp
            xd = self.single.to_device(0, keys)
            out = {}
            stats = self.single.time_device(
                lambda: out.__setitem__("v", cp.sort(xd)), 0, self.warmup, self.repeats,
                batch=HARNESS_BATCH)
            self._row(base, "cupy.sort", "device", 1, stats, verify(cp, out["v"], ref))

    def _torch(self, keys: np.ndarray, ref: Reference, base: dict) -> None:
        import torch

        dev = torch.device("cuda", 0) if self.kind == "cuda" else torch.device("cpu")
        t = torch.from_numpy(keys).to(dev)
        out = {}
        try:
            stats = timing.measure(lambda: out.__setitem__("v", torch.sort(t)),
                                   warmup=self.warmup, repeats=self.repeats,
                                   device=dev if dev.type == "cuda" else None,
                                   batch=HARNESS_BATCH if dev.type == "cuda" else 1)
        except (NotImplementedError, RuntimeError) as exc:  # e.g. no sort kernel for uint32
            if not isinstance(exc, NotImplementedError) and "not implemented" not in str(exc):
                raise
            self._skip(f"torch.sort {keys.dtype} on {dev.type}",
                       str(exc).splitlines()[0])
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
        n = min(self.cfg.matrix_size, 1000003)
        cases = [("uint32", "uniform"), ("uint32", "all_equal"), ("uint32", "reverse"),
                 ("float32", "normal"), ("uint64", "few_unique")]
        rows = []
        for d in counts:
            b = make_backend(self.kind, d, [i % self.available for i in range(d)])
            try:
                for i, (kt, dist) in enumerate(cases):
                    keys = make_keys(dist, kt, n, seed + i)
                    ref = reference(keys, self.cfg.verify_numpy_max_keys)
                    host_in = b.pinned_copy(keys)
                    for alg in self.cfg.algorithms:
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

    # -- checks and bars --------------------------------------------------------------------
    def harness_check(self, seed: int) -> Check | None:
        """The single-device P2PMerge.sort (which is cupy.sort) vs cupy.sort: gpulab's overhead.

        Both sides run the same CUB kernel, so this judges the harness, not the GPU. None on CPU.
        Timed in ABBA blocks (path, raw, raw, path; one batch each) at HARNESS_MIN_KEYS keys or
        more; the value is the median over blocks of the block's path time / raw time, minus 1.
        """
        n = max(self.cfg.bar_keys, HARNESS_MIN_KEYS)
        case = f"{n} uint32 keys, one device"
        if self.kind != "cuda":
            self._skip(HARNESS_CHECK, "needs a CUDA GPU and CuPy (cupy.sort is the raw call)")
            return None
        b = self.single
        cp = b.cp
        xd = b.to_device(0, make_keys("uniform", "uint32", n, seed))
        with b.on(0):
            ref = Reference(fingerprint(cp, xd), None)
        res = {}
        path = p2p.P2PMerge(b, NullTimer())
        calls = {"path": lambda: res.__setitem__("o", path.sort([xd])[0]),
                 "raw": lambda: res.__setitem__("c", cp.sort(xd))}
        samples = {"path": [], "raw": []}

        def one_batch(side: str, warmup: int = 0) -> float:
            s = b.time_device(calls[side], 0, warmup, 1, batch=HARNESS_BATCH).samples[0]
            samples[side].append(s)
            return s * HARNESS_BATCH

        for side in calls:  # both sides' first calls, untimed beyond the warm-up
            one_batch(side, self.warmup)
            samples[side].clear()
        ratios = timing.block_ratios(one_batch, timing.abba_order(
            "path", "raw", max(HARNESS_BLOCKS, self.repeats)), "path", "raw")
        so, sc = timing.summarize(samples["path"]), timing.summarize(samples["raw"])
        base = {"sweep": "harness", "key_type": "uint32", "distribution": "uniform", "n_keys": n}
        with b.on(0):
            co = verify(cp, res["o"], ref)
            cc = verify(cp, res["c"], ref)
        self._row(base, "p2p", "device", 1, so, co, note="gpulab single-device path")
        self._row(base, "cupy.sort", "device", 1, sc, cc, note="raw library call")
        del xd, res
        self.free()
        return harness_verdict(case, timing.summarize(ratios).median, len(ratios))

    def moved_keys_checks(self, seed: int) -> list[Check]:
        """Keys moved by P2P merges, counted from origin tags, on every device count >= 2 (on 2
        logical devices where the host has one)."""
        if "p2p" not in self.cfg.algorithms:
            return []
        n = max(2, min(self.cfg.matrix_size, 1 << 20))
        counts = [d for d in self.counts if d >= 2]
        out = []
        for d in counts or [2]:
            logical = d > self.available
            b = make_backend(self.kind, d, [i % self.available for i in range(d)]) if logical \
                else self.backends[d]
            case = f"{n} distinct uint32 keys on {d} {'logical ' if logical else ''}devices"
            try:
                counted, needed, claimed = moves.count_run(
                    b, n, seed + d, lambda be: p2p.P2PMerge(be, NullTimer()))
                out.append(moves.judge(case, d, counted, needed, claimed))
            except Exception as exc:  # noqa: BLE001 - a crash is a failed check
                self._fail(f"moved-keys count, {case}", exc)
            finally:
                if logical:
                    b.free()
                    b.close()
        self.free()
        return out

    def checks(self, logic: list[dict]) -> list[Check]:
        """Every timed run and logic-check run verified, every crash a failed check."""
        out = []
        for r in self.rows:
            case = (f"{r['algorithm']} on {r['devices']} device(s) {r['key_type']}/"
                    f"{r['distribution']}/{r['n_keys']} ({r['scope']})")
            out.append(Check.of("sorted permutation of the input", case, bool(r["verified"]),
                                note=r.get("checks", "")))
        for r in logic:
            case = (f"{r['algorithm']} on {r['logical_devices']} logical devices "
                    f"{r['key_type']}/{r['distribution']}/{r['n_keys']}")
            out.append(Check.of("sorted permutation of the input", case, bool(r["verified"]),
                                note=r.get("checks", "")))
            if r["algorithm"] == "p2p":
                out.append(Check.of("every P2P pivot leftmost and valid", case,
                                    bool(r["pivots_leftmost"])))
        out += [Check.crashed(f["what"], f["error"]) for f in self.failures]
        return out


HARNESS_CHECK = "harness overhead: gpulab's call path vs the raw library call, same kernel"
HARNESS_BOUND = 0.05  # P2PMerge.sort on one device may cost at most 5% more than cupy.sort
# Back-to-back sorts per CUDA-event pair on both sides, so the launch gap before one call is not
# timed as part of it (issue 24); a sample is the batch time / HARNESS_BATCH.
HARNESS_BATCH = 5
# ABBA blocks of the check, its own sample count whatever the preset's repeats (as the GEMM
# harness check's): two cupy-first rounds of the preset's repeats read a healthy H100 at +10.3 %
# and +7.0 % (docs/runs/2026-12-06-quick-h100).
HARNESS_BLOCKS = 12
# Keys the check sorts at least, whatever bar_keys: at the quick preset's 2^20 a CUB sort takes
# ~92 us of an H100 and ~60 us of the host to issue (either side), so a host hiccup shows in the
# ratio: ABBA blocks read +0.7 % and +2.2 % there, +0.12 % and +0.17 % at 2^24 (~0.5 ms per sort;
# docs/runs/2026-12-06-quick-h100/probe.txt).
HARNESS_MIN_KEYS = 1 << 24


def harness_verdict(case: str, ratio: float, blocks: int = 0) -> Check:
    """The check for a median path/raw time ``ratio``: overhead ``ratio - 1`` within the bound."""
    return Check.within(HARNESS_CHECK, case, ratio - 1.0, HARNESS_BOUND,
                        note=f"median over {blocks} ABBA blocks (P2PMerge.sort on one device, "
                             f"cupy.sort, cupy.sort, P2PMerge.sort; each a batch of {HARNESS_BATCH} "
                             f"back-to-back calls between one CUDA-event pair, device-resident "
                             f"keys) of the block's path time / raw time, minus 1")


# Host-to-host sorting on P GPUs: each GPU has its own H2D/D2H path and sorts 1/P of the keys, so
# a multi-GPU algorithm that pays is at least half as fast per GPU as it is on one.
EFFICIENCY_THRESHOLD = 0.5
SPEEDUP_SOURCE = "the same algorithm on the same keys on one device, same run (table runs)"


def speedup_bars(rows: list[dict], kind: str, available: int) -> list[Bar]:
    """Per algorithm: host-to-host speed-up at the most devices, largest size-sweep input."""
    name = "multi-device sort speed-up vs one device"
    if kind != "cuda":
        return [Bar.not_applicable(name, "CPU virtual devices share the host's cores: a speed-up "
                                         "over one of them measures the core split, not added "
                                         "hardware", unit="x", threshold=EFFICIENCY_THRESHOLD)]
    if available < 2:
        return [Bar.not_applicable(name, f"needs >= 2 GPUs ({available} here)", unit="x",
                                   threshold=EFFICIENCY_THRESHOLD)]
    df = pd.DataFrame(rows)
    if df.empty:
        return [Bar.not_applicable(name, "no host-to-host runs", unit="x")]
    df = df[(df["scope"] == "host-to-host") & (df["sweep"] == "size") & df["verified"].astype(bool)]
    if df.empty:
        return [Bar.not_applicable(name, "no verified host-to-host run of the size sweep",
                                   unit="x")]
    n = int(df["n_keys"].max())
    df = df[df["n_keys"] == n]
    out = []
    for alg, grp in df.groupby("algorithm", sort=False):
        one, most = grp[grp["devices"] == 1], grp[grp["devices"] == grp["devices"].max()]
        p = int(most["devices"].iloc[0])
        bar = f"{alg} sort of {n} keys on {p} GPUs: speed-up vs one GPU"
        if p < 2 or one.empty:
            out.append(Bar.not_applicable(bar, "no run on one device and on more than one",
                                          unit="x"))
            continue
        speedup = float(one["time_s_median"].iloc[0]) / float(most["time_s_median"].iloc[0])
        out.append(Bar.measure(bar, speedup, p, source=SPEEDUP_SOURCE,
                               threshold=EFFICIENCY_THRESHOLD, unit="x",
                               note="host-to-host (H2D, sort, D2H), median times; ratio = "
                                    "efficiency = speed-up / P"))
    return out
